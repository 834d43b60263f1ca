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
  allows) and per SageMaker refusal sending the run back to the queue (recovery.MAX_REFUSALS);
- "Wait for the data preparation": the looks its Choice allows (steps/prepare.MAX_LOOKS, enough for every stage to
  run its MaxRuntimeInSeconds at the handler's waits). A data preparation run (kind: prepare) takes its own path
  after registration, which a training run never enters: each path is bounded on its own.
Retries are counted in full (every retrier at its MaxAttempts) on every visit of a state outside the two poll
loops, and once per state inside them: a transient failure on every one of 2,000 looks is not in the bound.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from lustrain_core import prepare_plan, recovery
from lustrain_core.steps import prepare

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
PREPARE_WAIT = "$.prepare.wait_seconds"
#: the first state of a data preparation run's own path (the kind Choice's)
PREPARE_PATH = "Create the data preparation's network"
TRAINING_PATH = "Check the SageMaker quota"


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


def reachable(machine: dict[str, Any], start: str) -> set[str]:
    found, todo = set(), [start]
    while todo:
        name = todo.pop()
        if name not in found:
            found.add(name)
            todo += sorted(edges(machine["States"][name]))
    return found


def prepare_only(machine: dict[str, Any]) -> set[str]:
    """The states only a data preparation run enters."""
    return reachable(machine, PREPARE_PATH) - reachable(machine, TRAINING_PATH)


def most_prepare_looks(machine: dict[str, Any]) -> int:
    """The looks at a preparation the state machine allows: its Choice's bound on $.prepare.looks."""
    (bound,) = [
        rule["NumericLessThan"]
        for state in machine["States"].values()
        for choice in state.get("Choices", [])
        for rule in choice.get("And", [])
        if rule.get("Variable") == "$.prepare.looks" and "NumericLessThan" in rule
    ]
    return int(bound)


def prepare_worst_case(parameters: dict[str, int], looks: int | None = None) -> int:
    """The most history events a data preparation run can record: its registration, its own path with the look
    loop at its bound (or `looks`), and the failure path's states."""
    machine = definition(parameters)
    top = machine["States"]
    loop = loop_states(machine, waits_by_path(machine)[PREPARE_WAIT])
    looks = most_prepare_looks(machine) if looks is None else looks
    total = 2
    for name in {"Register the job"} | reachable(machine, PREPARE_PATH):
        state = top[name]
        if name in loop:
            n = looks if state["Type"] == "Wait" else looks + 1
            retried = events(state, with_retries=True) - events(state, with_retries=False)
            total += n * events(state, with_retries=False) + retried
        else:
            total += events(state, with_retries=True)
    return total


def worst_case(parameters: dict[str, int]) -> int:
    """The most history events one training run can record with these parameter values."""
    machine = definition(parameters)
    waits = waits_by_path(machine)
    assert set(waits) == {QUEUE_WAIT, FILESYSTEM_WAIT, ATTEMPT_WAIT, PREPARE_WAIT}, (
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
        if name in prepare_only(machine):
            continue
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
    worst = prepare_worst_case(maxima())
    assert worst < HISTORY_QUOTA, (
        f"a data preparation's {worst} history events at {maxima()}: over Step Functions' {HISTORY_QUOTA}"
    )


def test_the_worst_case_counts_nine_events_per_look_of_each_poll_loop():
    # one look: the Lambda task (5 events), the Choice (2) and the Wait (2)
    base = worst_case({"QueueMaxLooks": 100, "FilesystemPollMaxCount": 100})
    assert worst_case({"QueueMaxLooks": 101, "FilesystemPollMaxCount": 100}) - base == 9
    assert worst_case({"QueueMaxLooks": 100, "FilesystemPollMaxCount": 101}) - base == 9


def test_a_preparation_counts_nine_events_per_look_and_none_of_the_training_paths():
    base = {"QueueMaxLooks": 100, "FilesystemPollMaxCount": 100}
    assert prepare_worst_case(base, 101) - prepare_worst_case(base, 100) == 9
    # the preparation's bound does not move with the training path's loops
    assert prepare_worst_case({**base, "QueueMaxLooks": 101}) == prepare_worst_case(base)
    assert "Check the SageMaker quota" not in reachable(definition(base), PREPARE_PATH)


def test_a_preparations_looks_cover_every_stage_running_its_longest():
    # the state machine's bound is the handler's, and its waits let each stage run MaxRuntimeInSeconds within it
    assert most_prepare_looks(definition({})) == prepare.MAX_LOOKS
    looks, stage_looks = 0, []
    for _ in prepare_plan.STAGES:
        waited, n = 0, 0
        while waited < prepare_plan.MAX_RUNTIME_SECONDS:
            n += 1
            waited += prepare.wait_after(n)
        stage_looks.append(n + 1)  # and the look that finds it Completed
        looks += n + 1
    assert looks <= prepare.MAX_LOOKS, stage_looks
