"""The registry of resource kinds (lustrain_core.resources) against botocore's models: each kind's describe call,
its ids parameter, its result list, the id and state fields exist as the services define them."""

from __future__ import annotations

import botocore.session
import pytest
from lustrain_core import resources as registry
from lustrain_core.steps import teardown

SESSION = botocore.session.get_session()


def camel(operation: str) -> str:
    return "".join(part.capitalize() for part in operation.split("_"))


@pytest.mark.parametrize("kind", registry.KINDS, ids=lambda k: k.name)
def test_each_kind_is_described_as_its_service_model_says(kind):
    model = SESSION.get_service_model(kind.service)
    operation = model.operation_model(camel(kind.describe))
    assert kind.ids_param in operation.input_shape.members
    output = operation.output_shape
    if kind.single:  # described one at a time, by name: the answer is the item, or holds it
        item = output.members[kind.result_key] if kind.result_key else output
    else:
        item = output.members[kind.result_key].member
    assert kind.id_key in item.members
    if kind.state_key is not None:
        field = item
        for key in kind.state_key.split("."):  # a nested state (a warm pool's WarmPoolStatus.Status)
            assert key in field.members
            field = field.members[key]
        enum = {value.lower() for value in field.enum}
        assert not enum or (kind.gone | kind.alive) <= enum
    if kind.tag_filter:
        assert "Filters" in operation.input_shape.members
    if kind.stop:  # a job: stopped by name, whose ARN (for its tags) its description gives
        assert kind.ids_param in model.operation_model(camel(kind.stop)).input_shape.members
        assert kind.arn_key in item.members


def test_the_network_is_deleted_in_dependency_order_over_exactly_the_registrys_network_kinds():
    assert teardown.NETWORK_ORDER == registry.NETWORK_ORDER
    assert {k.name for k in registry.KINDS if k.family == "network"} == set(registry.NETWORK_ORDER)
    # the group and the endpoint go before the subnet they live in, the VPC last
    order = registry.NETWORK_ORDER
    assert order.index("security_group") < order.index("subnet") < order.index("vpc") == len(order) - 1


def test_a_warm_pool_exists_only_while_it_holds_instances():
    pool = registry.WARM_POOL
    assert registry.present(pool, {"WarmPoolStatus": {"Status": "Available"}})
    assert registry.present(pool, {"WarmPoolStatus": {"Status": "InUse"}})
    assert not registry.present(pool, {"WarmPoolStatus": {"Status": "Terminated"}})
    assert not registry.present(pool, {"WarmPoolStatus": {"Status": "Reused"}})
    assert not registry.present(pool, {"TrainingJobStatus": "Completed"})  # a job that kept no pool


def test_the_jobs_a_run_starts_are_the_kinds_that_say_how_they_are_stopped():
    assert {k.name for k in registry.KINDS if k.stop} == {"training_job", "processing_job"}
