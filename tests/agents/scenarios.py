"""The scenarios each real CLI is run through, with what the contract says the run must produce.

An expectation is written from the scenario and docs/contract.md, never from our output: the tool
events in order as (type, isSuccess) — `None` when the contract gives the event no `isSuccess` —,
the error class every `error` event (and every retry `warning` carrying a class) must have, and
whether `unknown` events are allowed. The end-of-run error of a non-zero exit (`<cli> exited with
code N`, class `agent_exit`) is allowed beside the scenario's class: the CLIs exit non-zero on a
failed run, and the contract reports that as its own event.

Tool calls are written in each CLI's own tool vocabulary (the tools its requests offer: Claude
Code's `Read`/`Bash`/`Write`/`Edit`, Codex's `exec_command`/`apply_patch`, Gemini CLI's
`read_file`/`run_shell_command`/..., opencode's `read`/`bash`/...), so the CLI itself runs them in
the scratch directory.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from tests.agents.model_server import ALWAYS, Call, Cut, Reply, Scripted, Stall, Status, Step

NOTES = "alpha\nbeta needle\ngamma\n"
# A command that fails for every CLI (`test -f missing` does not: Claude Code reads its exit 1 as
# "Condition is false", not an error)
FAILING = "python3 -c 'import sys; sys.exit(3)'"


@dataclass(frozen=True)
class Expect:
    tools: tuple[tuple[str, bool | None], ...] = ()
    error_class: str | None = None  # None: the run has no error event at all (the exit error aside)
    warning_class: str | None = None  # the class every classed (retry) warning must have, when no error is expected
    unknown_ok: bool = False
    agent_text: bool = False  # an `agent` event must carry the scripted final text
    exit_nonzero_ok: bool = True


@dataclass(frozen=True)
class Scenario:
    name: str
    cli: str
    prompt: str
    script: Callable[[Path], list[Step | Scripted]]
    expect: Expect
    refused: bool = False  # point the CLI at a port nothing listens on
    max_turns: int | None = None
    sigint_when: str | None = None  # SIGINT once a stdout line contains this
    sigint_after_s: float = 1.0
    unbounded_retries: bool = False  # Codex: keep its default of retrying a refused connection for ever
    variant: str | None = None  # a set-up other than the working headless one (tests/agents/run.py VARIANTS)
    stdin_words: int = 0  # a prompt of this many words on the CLI's stdin (beside the `-p` prompt)
    live: bool = True  # False: covered by a committed capture only (tests/agents/captures/)
    known_bug: str | None = None  # the normalizer bug being fixed elsewhere (xfail strict until merged)
    final_text: str = "All done: scenario finished."
    extra: dict[str, str] = field(default_factory=dict)


FINAL = "All done: scenario finished."

# ---- Claude Code ----------------------------------------------------------------------------------

def _claude_tools(work: Path) -> list[Step | Scripted]:
    return [
        Reply("Reading the notes first.", (Call("Read", {"file_path": str(work / "notes.txt")}),)),
        Reply("Listing the folder.", (Call("Bash", {"command": "ls", "description": "List files"}),)),
        Reply("Searching.", (Call("Bash", {"command": "grep -n needle notes.txt", "description": "Search"}),)),
        Reply("Running the check, which fails.", (Call("Bash", {"command": FAILING, "description": "Run the check"}),)),
        Reply("Writing the summary.", (Call("Write", {"file_path": str(work / "summary.txt"), "content": "first\n"}),)),
        Reply("Editing it.", (Call("Edit", {"file_path": str(work / "summary.txt"), "old_string": "first",
                                            "new_string": "second"}),)),
        Reply(FINAL),
    ]


def _fault(kind: str, retry_after_s: float | None = None) -> Callable[[Path], list[Step | Scripted]]:
    return lambda work: [Scripted(Status(kind, retry_after_s), ALWAYS)]


def _always(step: Step) -> Callable[[Path], list[Step | Scripted]]:
    return lambda work: [Scripted(step, ALWAYS)]


TOOLS_RUN = (("read", True), ("list", True), ("search", True), ("command", False), ("write", True), ("write", True))


def _claude() -> list[Scenario]:
    c = "claude-code"
    fault = "Summarize notes.txt."
    return [
        Scenario("plain", c, "Say hello.", lambda w: [Reply(FINAL)], Expect(agent_text=True, exit_nonzero_ok=False)),
        Scenario("tools", c, "Look at notes.txt, then write a summary.", _claude_tools,
                 Expect(tools=TOOLS_RUN, agent_text=True, exit_nonzero_ok=False)),
        Scenario("auth-401", c, fault, _fault("auth"), Expect(error_class="auth")),
        Scenario("auth-403", c, fault, _fault("forbidden"), Expect(error_class="auth")),
        Scenario("rate-limit-429", c, fault, _fault("rate_limit", 0.2), Expect(error_class="rate_limit")),
        Scenario("quota", c, fault, _fault("quota"), Expect(error_class="quota")),
        Scenario("server-500", c, fault, _fault("server_error"), Expect(error_class="provider_unavailable")),
        Scenario("overloaded-529", c, fault, _fault("overloaded"), Expect(error_class="provider_unavailable")),
        Scenario("context-length", c, fault, _fault("context_length"), Expect(error_class="context_length")),
        Scenario("refused", c, fault, lambda w: [], Expect(error_class="timeout"), refused=True),
        Scenario("cut-stream", c, fault, _always(Cut()), Expect(error_class="timeout")),
        # Claude waits >= 300 s on a stalled stream whatever its settings say: a committed capture only
        Scenario("stalled-stream", c, fault, _always(Stall(1400)), Expect(error_class="timeout"), live=False),
        Scenario("max-turns", c, "Keep checking the folder.", lambda w: [Scripted(Reply(
            "Checking again.", (Call("Bash", {"command": "ls", "description": "List files"}),)), ALWAYS)],
                 Expect(tools=(("list", True),), error_class="max_turns"), max_turns=1),
        Scenario("sigint", c, "Run the slow job.", lambda w: [Reply("Starting the slow job.", (
            Call("Bash", {"command": "sleep 30", "description": "Slow job"}),))],
                 Expect(tools=(("command", False),), error_class="cancelled"), sigint_when='"tool_use"'),
    ]


# ---- Codex ----------------------------------------------------------------------------------------
def _codex_tools(work: Path) -> list[Step | Scripted]:
    def sh(cmd: str) -> Call:
        return Call("exec_command", {"cmd": cmd, "yield_time_ms": 5000})

    return [
        Reply("Reading the notes first.", (sh("cat notes.txt"),)),
        Reply("Listing the folder.", (sh("ls"),)),
        Reply("Searching.", (sh("grep -n needle notes.txt"),)),
        Reply("Running the check, which fails.", (sh(FAILING),)),
        Reply("Writing the summary.", (Call("apply_patch", "*** Begin Patch\n*** Add File: summary.txt\n+first\n*** End Patch\n"),)),
        Reply("Editing it.", (Call("apply_patch", "*** Begin Patch\n*** Update File: summary.txt\n@@\n-first\n+second\n*** End Patch\n"),)),
        Reply(FINAL),
    ]


def _codex() -> list[Scenario]:
    c = "codex"
    fault = "Summarize notes.txt."
    return [
        Scenario("plain", c, "Say hello.", lambda w: [Reply(FINAL)], Expect(agent_text=True, exit_nonzero_ok=False)),
        Scenario("tools", c, "Look at notes.txt, then write a summary.", _codex_tools,
                 Expect(tools=TOOLS_RUN, agent_text=True, exit_nonzero_ok=False)),
        Scenario("auth-401", c, fault, _fault("auth"), Expect(error_class="auth")),
        Scenario("auth-403", c, fault, _fault("forbidden"), Expect(error_class="auth")),
        Scenario("rate-limit-429", c, fault, _fault("rate_limit", 0.2), Expect(error_class="rate_limit")),
        Scenario("quota", c, fault, _fault("quota"), Expect(error_class="quota")),
        Scenario("server-500", c, fault, _fault("server_error"), Expect(error_class="provider_unavailable")),
        Scenario("overloaded-503", c, fault, _fault("overloaded"), Expect(error_class="provider_unavailable")),
        Scenario("context-length", c, fault, _fault("context_length"), Expect(error_class="context_length")),
        Scenario("refused", c, fault, lambda w: [], Expect(error_class="timeout"), refused=True),
        # Codex's default: a refused connection retried for ever, "Reconnecting... waiting for network"
        # notices (retry warnings, class timeout) until the user interrupts it
        Scenario("refused-unbounded", c, fault, lambda w: [], Expect(error_class=None, warning_class="timeout"),
                 refused=True, unbounded_retries=True, sigint_when="waiting for network", sigint_after_s=4.0),
        Scenario("cut-stream", c, fault, _always(Cut()), Expect(error_class="timeout")),
        Scenario("stalled-stream", c, fault, _always(Stall(60)), Expect(error_class="timeout")),
        # `codex exec` has no turn limit (docs/contract.md): no max-turns scenario
        Scenario("sigint", c, "Run the slow job.", lambda w: [Reply("Starting the slow job.", (
            Call("exec_command", {"cmd": "sleep 30", "yield_time_ms": 60000}),))],
                 # the started command is never completed: drained as `unknown` (contract)
                 Expect(tools=(), error_class="cancelled", unknown_ok=True),
                 sigint_when='"item.started"'),
    ]


# ---- Gemini CLI and opencode ----------------------------------------------------------------------
# A CLI whose normalizer format is still on a branch goes in FORMATS_PENDING: every check of its
# events is expected to fail, and the tests mark its scenarios xfail(strict=True) with
# FORMATS_PENDING_REASON. The integrator empties it when the format is merged (strict xfail turns a
# passing check into a failure, so a forgotten entry cannot hide). Gemini CLI's and opencode's
# formats were merged with r4-formats: none is pending.
FORMATS_PENDING: frozenset[str] = frozenset()
FORMATS_PENDING_REASON = "normalizer format not merged yet: empty scenarios.FORMATS_PENDING after merging it"


def _gemini_tools(work: Path) -> list[Step | Scripted]:
    return [
        Reply("Reading the notes first.", (Call("read_file", {"file_path": str(work / "notes.txt")}),)),
        Reply("Listing the folder.", (Call("list_directory", {"dir_path": str(work)}),)),
        Reply("Searching.", (Call("grep_search", {"pattern": "needle", "dir_path": str(work)}),)),
        Reply("Running the check, which fails.", (Call("run_shell_command", {"command": FAILING,
                                                                             "description": "Run the check"}),)),
        Reply("Writing the summary.", (Call("write_file", {"file_path": str(work / "summary.txt"), "content": "first\n"}),)),
        Reply("Editing it.", (Call("replace", {"file_path": str(work / "summary.txt"), "old_string": "first",
                                               "new_string": "second", "instruction": "Replace first by second."}),)),
        Reply(FINAL),
    ]


def _opencode_tools(work: Path) -> list[Step | Scripted]:
    return [
        Reply("Reading the notes first.", (Call("read", {"filePath": str(work / "notes.txt")}),)),
        Reply("Listing the folder.", (Call("bash", {"command": "ls", "description": "List files"}),)),
        Reply("Searching.", (Call("grep", {"pattern": "needle", "path": str(work)}),)),
        Reply("Running the check, which fails.", (Call("bash", {"command": FAILING, "description": "Run the check"}),)),
        Reply("Writing the summary.", (Call("write", {"filePath": str(work / "summary.txt"), "content": "first\n"}),)),
        Reply("Editing it.", (Call("edit", {"filePath": str(work / "summary.txt"), "oldString": "first",
                                            "newString": "second"}),)),
        Reply(FINAL),
    ]


def _common_faults(c: str, overloaded: str, slow_network_retries: bool = False) -> list[Scenario]:
    """`slow_network_retries`: the CLI retries a network failure with a backoff no setting shortens
    (opencode: 5 retries, about a minute): those scenarios are committed captures only."""
    fault = "Summarize notes.txt."
    live = not slow_network_retries
    return [
        Scenario("auth-401", c, fault, _fault("auth"), Expect(error_class="auth")),
        Scenario("auth-403", c, fault, _fault("forbidden"), Expect(error_class="auth")),
        Scenario("rate-limit-429", c, fault, _fault("rate_limit", 0.2), Expect(error_class="rate_limit")),
        Scenario("quota", c, fault, _fault("quota", 0.2), Expect(error_class="quota")),
        Scenario("server-500", c, fault, _fault("server_error", 0.2), Expect(error_class="provider_unavailable")),
        Scenario(overloaded, c, fault, _fault("overloaded", 0.2), Expect(error_class="provider_unavailable")),
        Scenario("context-length", c, fault, _fault("context_length"), Expect(error_class="context_length")),
        Scenario("refused", c, fault, lambda w: [], Expect(error_class="timeout"), refused=True, live=live),
        Scenario("cut-stream", c, fault, _always(Cut()), Expect(error_class="timeout"), live=live),
    ]


def _sigint(c: str, call: Call, expect: Expect, when: str, after_s: float = 1.0, variant: str | None = None,
            name: str = "sigint") -> Scenario:
    return Scenario(name, c, "Run the slow job.", lambda w: [Reply("Starting the slow job.", (call,))], expect,
                    sigint_when=when, sigint_after_s=after_s, variant=variant)


def _gemini() -> list[Scenario]:
    c = "gemini-cli"
    fault = "Summarize notes.txt."
    slow_job = Call("run_shell_command", {"command": "sleep 30", "description": "Slow job"})
    # Gemini CLI exits 0 with no result after SIGINT: the call it printed is never answered, so it
    # is drained as `unknown` (contract); the tap's eof `signal` makes the run `cancelled`
    cancelled = Expect(tools=(), error_class="cancelled", unknown_ok=True)
    return [
        Scenario("plain", c, "Say hello.", lambda w: [Reply(FINAL)], Expect(agent_text=True, exit_nonzero_ok=False)),
        Scenario("tools", c, "Look at notes.txt, then write a summary.", _gemini_tools,
                 Expect(tools=TOOLS_RUN, agent_text=True, exit_nonzero_ok=False)),
        *_common_faults(c, "overloaded-503"),
        # the spec's section 4 beyond the common faults: the API's answer to an unknown key (a 400
        # with API_KEY_INVALID, not a 401), invalid streams (exit 0 with an error record: an
        # empty answer is no class of the contract, `other`; a truncated one `context_length`),
        # and the headless start-up failures (nothing on stdout, exit 55 and 41: the exit error only)
        Scenario("bad-key-400", c, fault, _fault("bad_key"), Expect(error_class="auth")),
        Scenario("empty-response", c, fault, _always(Reply()), Expect(error_class="other", exit_nonzero_ok=False)),
        Scenario("max-tokens", c, fault, _always(Reply(truncated=True)),
                 Expect(error_class="context_length", exit_nonzero_ok=False)),
        Scenario("untrusted-folder", c, fault, lambda w: [Reply(FINAL)], Expect(), variant="untrusted"),
        # a prompt over the model's window (900,000 words on stdin, the spec's `context-preflight`):
        # the CLI sends nothing and reports nothing, exit 0. With stdout a pipe, as under the tap,
        # 0.61.0 exits before its output is written: the echoed prompt line is cut at 64-128 KiB
        # (an unparseable line: a plain warning) and no `result` follows, so no error, no usage
        Scenario("context-preflight", c, "Summarize the text on stdin.", lambda w: [Reply(FINAL)],
                 Expect(exit_nonzero_ok=False), stdin_words=900_000),
        Scenario("auth-type-unset", c, fault, lambda w: [Reply(FINAL)], Expect(), variant="no-auth-type"),
        Scenario("max-turns", c, "Keep checking the folder.", lambda w: [Scripted(Reply(
            "Checking again.", (Call("list_directory", {"dir_path": str(w)}),)), ALWAYS)],
                 Expect(tools=(("list", True),), error_class="max_turns", unknown_ok=True), max_turns=1),
        _sigint(c, slow_job, cancelled, '"tool_use"'),
        # by default the CLI re-launches itself in a child node process: the signal reaches both
        _sigint(c, slow_job, cancelled, '"tool_use"', variant="relaunch", name="sigint-relaunch"),
    ]


def _opencode() -> list[Scenario]:
    c = "opencode"
    return [
        Scenario("plain", c, "Say hello.", lambda w: [Reply(FINAL)], Expect(agent_text=True, exit_nonzero_ok=False)),
        Scenario("tools", c, "Look at notes.txt, then write a summary.", _opencode_tools,
                 Expect(tools=TOOLS_RUN, agent_text=True, exit_nonzero_ok=False)),
        # opencode answers a context overflow by compacting the session and trying again, for ever
        # against a server that always overflows: interrupted after its first error
        *[replace(sc, sigint_when="ContextOverflowError", sigint_after_s=0.5) if sc.name == "context-length" else sc
          for sc in _common_faults(c, "overloaded-503", slow_network_retries=True)],
        # the spec's section 4 beyond the common faults. One context overflow: opencode compacts,
        # answers, and still exits 1 (a recovered error: the exit is no error event of its own)
        Scenario("context-length-once", c, "Summarize notes.txt.",
                 lambda w: [Scripted(Status("context_length")), Scripted(Reply(FINAL), ALWAYS)],
                 Expect(error_class="context_length", agent_text=True, exit_nonzero_ok=False)),
        # the build agent's step limit: the last step is forced to text, nothing says the limit was
        # hit (docs/contract.md: max_turns cannot be reported for opencode), exit 0
        Scenario("max-steps", c, "Keep checking the folder.", lambda w: [Scripted(Reply(
            "Checking again.", (Call("bash", {"command": "ls", "description": "List files"}),)), ALWAYS)],
                 Expect(tools=(("list", True), ("list", True)), exit_nonzero_ok=False), max_turns=3),
        # an answer cut at the output token limit: finish reason `length`, exit 0, `context_length`
        Scenario("max-tokens", c, "Summarize notes.txt.", lambda w: [Reply("The answer", truncated=True)],
                 Expect(error_class="context_length", exit_nonzero_ok=False)),
        Scenario("empty-response", c, "Summarize notes.txt.", lambda w: [Reply()], Expect(exit_nonzero_ok=False)),
        # a read outside the project: `opencode run` rejects the permission, the call fails and the
        # loop stops with exit 0 and no error
        Scenario("permission-rejected", c, "Read the host name.", lambda w: [
            Reply("Reading the host name.", (Call("read", {"filePath": "/etc/hostname"}),)), Reply(FINAL)],
                 Expect(tools=(("read", False),), exit_nonzero_ok=False)),
        # opencode prints a tool call only once it completed: SIGINT goes after its text
        Scenario("sigint", c, "Run the slow job.", lambda w: [Reply("Starting the slow job.", (
            Call("bash", {"command": "sleep 30", "description": "Slow job"}),))],
                 # opencode dies of the signal and never prints the call: no tool event at all
                 Expect(tools=(), error_class="cancelled", unknown_ok=True),
                 sigint_when="Starting the slow job", sigint_after_s=1.5),
    ]


SCENARIOS: dict[str, list[Scenario]] = {"claude-code": _claude(), "codex": _codex(), "gemini-cli": _gemini(),
                                        "opencode": _opencode()}


def scenario(cli: str, name: str) -> Scenario:
    return next(s for s in SCENARIOS[cli] if s.name == name)
