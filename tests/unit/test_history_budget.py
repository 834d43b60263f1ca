"""Step Functions keeps at most 25,000 events in an execution's history, and an execution that reaches them fails
with no Catch (Step Functions Developer Guide, "Step Functions service quotas": maximum execution history size,
a hard quota). The two loops a run can spend long in are bounded by the stack's parameters: QueueMaxLooks (looks at
the capacity queue over the run's whole compute.max_queue_hours) and FilesystemPollMaxCount (looks at the file
system). Each is given a MaxValue in template.yaml; this test computes, from the ASL and those maxima, the most
events one execution can record, and asserts it stays under the quota.

Events per visit of a state, as Step Functions records them (Developer Guide, "Viewing executions", history event
types): every state its ...StateEntered and ...StateExited (a Fail state only FailStateEntered); a Lambda task by
function ARN LambdaFunctionScheduled, ...Started and ...Succeeded/Failed/TimedOut; an integrated task
(lambda:invoke.waitForTaskToken) TaskScheduled, TaskStarted, TaskSubmitted and TaskSucceeded/Failed/TimedOut; a
Parallel state ParallelStateStarted and ParallelStateSucceeded/Failed besides, and its branches' events; the
execution ExecutionStarted and its end. A retried attempt records its task events again.

The visits: the ASL's loops all pass through a Wait state (checked below: without its Waits the graph has no
cycle), and each Wait is bounded:
- "Wait for capacity": the queue's waits. Each wait lasts at least max_queue_hours x 3600 / QueueMaxLooks seconds
  (lustrain_core.steps.queue.poll_seconds) and the run's time in the queue counts every wait of every return to
  it, so a run waits at most QueueMaxLooks times, plus one at the edge of each return;
- "Wait for the file system": FilesystemPollMaxCount (the Choice stops at it, check_filesystem raises at it);
  data.preload's warm-up is watched by the same loop (lifecycle PRELOADING), its looks counted in the same bound;
- "Wait before the next attempt": once per training attempt (recovery.MAX_ATTEMPTS, the most compute.max_attempts
  allows) and per SageMaker refusal sending the run back to the queue (recovery.MAX_REFUSALS).
Retries are counted in full (every retrier at its MaxAttempts) on every visit of a state outside the two poll
loops, and once per state inside them: a transient failure on every one of 2,000 looks is not in the bound.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from lustrain_core import recovery

from lustrain.twin.cfn import load_template

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = load_template(ROOT / "template.yaml")
PARAMETERS: dict[str, Any] = TEMPLATE["Parameters"]
SUBSTITUTIONS: dict[str, Any] = TEMPLATE["Resources"]["TrainingJobStateMachine"]["Properties"][
    "DefinitionSubstitutions"
]
ASL_TEXT = (ROOT / "statemachine" / "training_job.asl.json").read_text()
#: Step Functions' maximum execution history size
HISTORY_QUOTA = 25_000

QUEUE_WAIT = "$.quota.wait_seconds"
FILESYSTEM_WAIT = "$.filesystem.wait_seconds"
ATTEMPT_WAIT = "$.recovery.wait_seconds"


def definition(parameters: dict[str, int]) -> dict[str, Any]:
    """The ASL with the given parameter values (the others at their defaults, ARNs as samples)."""

    def value(match: re.Match[str]) -> str:
        substitution = SUBSTITUTIONS[match.group(1)]
        if isinstance(substitution, dict) and "Ref" in substitution:
            name = substitution["Ref"]
            if name == "AWS::Partition":
                return "aws"
            return str(parameters.get(name, PARAMETERS[name]["Default"]))
        return "arn:aws:lambda:us-east-1:123456789012:function:sample"

    found: dict[str, Any] = json.loads(re.sub(r"\$\{([^}]+)\}", value, ASL_TEXT))
    return found


def attempt_events(state: dict[str, Any]) -> int:
    """The task events of one attempt of a Task state."""
    return 4 if str(state["Resource"]).endswith(".waitForTaskToken") else 3


def retries(state: dict[str, Any]) -> int:
    return sum(int(r.get("MaxAttempts", 3)) for r in state.get("Retry", []))


def events(state: dict[str, Any], *, with_retries: bool) -> int:
    """The events one visit of a state records (its Parallel branches apart)."""
    kind = state["Type"]
    if kind == "Fail":
        return 1
    if kind == "Task":
        attempts = 1 + (retries(state) if with_retries else 0)
        return 2 + attempt_events(state) * attempts
    if kind == "Parallel":
        return 4
    return 2


def edges(state: dict[str, Any]) -> set[str]:
    found = {state["Next"]} if "Next" in state else set()
    found |= {c["Next"] for c in state.get("Choices", [])}
    found |= {state["Default"]} if "Default" in state else set()
    found |= {c["Next"] for c in state.get("Catch", [])}
    return found


def scopes(machine: dict[str, Any]) -> list[dict[str, Any]]:
    found = [machine]
    for state in machine["States"].values():
        for branch in state.get("Branches", []):
            found += scopes(branch)
    return found


def waits_by_path(machine: dict[str, Any]) -> dict[str, str]:
    return {
        state.get("SecondsPath", ""): name
        for scope in scopes(machine)
        for name, state in scope["States"].items()
        if state["Type"] == "Wait"
    }


def loop_states(scope: dict[str, Any], wait: str) -> set[str]:
    """The states of the shortest cycle through a Wait state (the loop it paces)."""
    paths = [[scope["States"][wait]["Next"]]]
    seen: set[str] = set()
    while paths:
        path = paths.pop(0)
        if path[-1] == wait:
            return set(path)
        if path[-1] in seen:
            continue
        seen.add(path[-1])
        paths += [[*path, n] for n in sorted(edges(scope["States"][path[-1]]))]
    raise AssertionError(f"{wait} is in no loop")


def worst_case(parameters: dict[str, int]) -> int:
    """The most history events one execution can record with these parameter values."""
    machine = definition(parameters)
    waits = waits_by_path(machine)
    assert set(waits) == {QUEUE_WAIT, FILESYSTEM_WAIT, ATTEMPT_WAIT}, (
        f"the ASL's Wait states changed ({sorted(waits)}): bound the new loop here"
    )
    attempts = recovery.MAX_ATTEMPTS + recovery.MAX_REFUSALS  # starts of a training job
    returns = attempts + 1  # visits to the queue: the first, and one after each attempt
    queue_waits = parameters["QueueMaxLooks"] + returns
    polls = parameters["FilesystemPollMaxCount"]

    top = machine["States"]
    (parallel,) = [name for name, s in top.items() if s["Type"] == "Parallel"]
    fs_scope = next(b for b in top[parallel]["Branches"] if waits[FILESYSTEM_WAIT] in b["States"])
    queue_loop = loop_states(machine, waits[QUEUE_WAIT])
    attempt_loop = loop_states(machine, waits[ATTEMPT_WAIT]) - queue_loop
    poll_loop = loop_states(fs_scope, waits[FILESYSTEM_WAIT])

    def looked(state: dict[str, Any], waits: int) -> int:
        """A poll loop's state: `waits` Wait visits, one visit more of the others (the look that ends the loop);
        its retries once."""
        n = waits if state["Type"] == "Wait" else waits + 1
        retried = events(state, with_retries=True) - events(state, with_retries=False)
        return n * events(state, with_retries=False) + retried

    total = 2  # ExecutionStarted and the execution's end
    for name, state in top.items():
        if name in queue_loop:
            # each return to the queue ends with one look more than its waits: returns extra looks in all
            total += looked(state, queue_waits) + (0 if state["Type"] == "Wait" else returns - 1) * events(
                state, with_retries=False
            )
        else:
            total += (attempts if name in attempt_loop else 1) * events(state, with_retries=True)
    for branch in top[parallel]["Branches"]:
        for name, state in branch["States"].items():
            in_loop = branch is fs_scope and name in poll_loop
            total += looked(state, polls) if in_loop else events(state, with_retries=True)
    return total


def maxima() -> dict[str, int]:
    return {name: int(PARAMETERS[name]["MaxValue"]) for name in ("QueueMaxLooks", "FilesystemPollMaxCount")}


def test_every_loop_of_the_asl_passes_through_a_wait_state():
    # with the Wait states taken out the graph has no cycle (Kahn's algorithm empties it): the Waits' bounds bound
    # every loop
    for scope in scopes(definition({})):
        graph = {
            name: edges(state) & set(scope["States"])
            for name, state in scope["States"].items()
            if state["Type"] != "Wait"
        }
        graph = {name: {n for n in nexts if n in graph} for name, nexts in graph.items()}
        while graph:
            sinks = [name for name, nexts in graph.items() if not nexts]
            assert sinks, f"a loop without a Wait state among {sorted(graph)}"
            graph = {name: nexts - set(sinks) for name, nexts in graph.items() if name not in sinks}


def test_the_loop_parameters_have_a_maximum_and_their_defaults_fit_it():
    for name, most in maxima().items():
        assert int(PARAMETERS[name]["Default"]) <= most, name


def test_the_worst_case_history_at_the_parameters_maxima_stays_under_step_functions_quota():
    worst = worst_case(maxima())
    assert worst < HISTORY_QUOTA, (
        f"{worst} history events at {maxima()}: over Step Functions' {HISTORY_QUOTA}"
    )


def test_the_worst_case_counts_nine_events_per_look_of_each_poll_loop():
    # one look: the Lambda task (5 events), the Choice (2) and the Wait (2)
    base = worst_case({"QueueMaxLooks": 100, "FilesystemPollMaxCount": 100})
    assert worst_case({"QueueMaxLooks": 101, "FilesystemPollMaxCount": 100}) - base == 9
    assert worst_case({"QueueMaxLooks": 100, "FilesystemPollMaxCount": 101}) - base == 9
