"""Before a direct tap starts its command: does the broker take our credentials and our role?

An unreachable broker is no reason to stop -- that is what the spool is for -- but entries spooled
under credentials the broker refuses would never be delivered, so a refusal is a configuration
error (one line naming the settings, exit 2: services/cli.py prints `AuthFailed`/`NoPermission` and
redis-py's errors of the same meaning). Through a gateway the token and the run key are checked by
services/tap/gateway_check.py instead.
"""

from __future__ import annotations

from services.settings import Settings

CREDENTIAL_CHECK_TIMEOUT_S = 2.0  # one PING before the command starts; a slow broker only delays the check
NO_BROKER = ("no broker configured: set GOOSE_INGEST_REDIS_URL (e.g. redis://127.0.0.1:6379/0) "
             "or GOOSE_INGEST_ENDPOINT (an ingest gateway)")


def broker_configured(settings: Settings) -> bool:
    return bool(settings.redis_url or settings.endpoint)


def check_before_start(settings: Settings, run: str) -> None:
    """The broker's or the gateway's word on our credentials and `run`, before anything is spooled:
    raises the configuration error a refusal means; returns when accepted or unreachable."""
    if not settings.endpoint:
        check_credentials(settings, run)
    else:  # the token and the run key, asked of the gateway (one line and exit 2 when refused)
        from services.tap.gateway_check import gateway_run

        gateway_run(settings, run)


def check_credentials(settings: Settings, run: str) -> None:
    """Refuse to start when the broker answers but rejects our credentials or role (config errors: exit 2).

    The role is probed with an XADD of id 0-0 to the run's shard: Redis checks the ACL first
    (NOPERM) and then refuses the id without writing anything."""
    if settings.redis_cluster:
        _check_credentials_cluster(settings, run)
        return
    from services.broker.facts import check_deployment_facts
    from services.broker.url import target, tls_options
    from services.tap.conn import AuthFailed, BrokerError, NoPermission, ReplyError, RespConnection

    conn = RespConnection(target(settings), connect_timeout=CREDENTIAL_CHECK_TIMEOUT_S,
                          socket_timeout=CREDENTIAL_CHECK_TIMEOUT_S, tls=tls_options(settings))
    try:
        conn.execute("PING")
        # another shard count than the data's would route this run elsewhere: one line, exit 2
        check_deployment_facts(settings.layout, conn.hgetall, conn.hsetnx, NoPermission)
        try:
            conn.execute("XADD", settings.layout.raw_stream(settings.layout.shard_of(run)), "0-0", "probe", "1")
        except NoPermission:
            raise
        except ReplyError:
            pass  # "must be greater than 0-0": allowed, and nothing was written
    except (AuthFailed, NoPermission):
        raise  # services/cli.py prints it as one line naming the settings
    except (BrokerError, OSError):
        pass  # down or unreachable: spool and deliver later
    finally:
        conn.close()


def _check_credentials_cluster(settings: Settings, run: str) -> None:
    """`check_credentials` through redis-py's RedisCluster (which routes the probe to the shard's node)."""
    from redis.exceptions import AuthenticationError, NoPermissionError, RedisError

    from services.broker.cluster import ensure_shard_count
    from services.broker.connect import sync_client_with_timeouts

    try:
        client = sync_client_with_timeouts(settings, socket_timeout=CREDENTIAL_CHECK_TIMEOUT_S,
                                           connect_timeout=CREDENTIAL_CHECK_TIMEOUT_S)
        try:
            client.ping()
            ensure_shard_count(client, settings.layout)
            try:
                client.execute_command("XADD", settings.layout.raw_stream(settings.layout.shard_of(run)),
                                       "0-0", "probe", "1")
            except NoPermissionError:
                raise
            except RedisError:
                pass
        finally:
            client.close()
    except (AuthenticationError, NoPermissionError):
        raise
    except (RedisError, OSError):
        pass
