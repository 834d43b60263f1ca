"""The patches that spend less CPU answer exactly as moto and botocore would: a resource's tags, the instance type
offerings, the action a request names, a state's JSONPaths and a client's class, each made or found once."""

from __future__ import annotations

import inspect
from typing import Any

import boto3
import pytest
from moto.core.utils import method_names_from_class
from moto.ec2.models.instance_types import INSTANCE_TYPE_OFFERINGS
from moto.ec2.responses import EC2Response
from twinhelpers import REGION, client

from lustrain.twin.patches import asl_parse, dispatch, loaders, offerings


def test_a_resources_tags_are_the_ones_moto_matches_by_its_id(moto_twin: None) -> None:
    from moto.backends import get_backend

    ec2 = client("ec2")
    vpcs = [ec2.create_vpc(CidrBlock=f"10.{i}.0.0/16")["Vpc"]["VpcId"] for i in range(3)]
    ec2.create_tags(Resources=vpcs[:2], Tags=[{"Key": "lustrain:job", "Value": "a"}])
    ec2.create_tags(Resources=[vpcs[1]], Tags=[{"Key": "Name", "Value": "second"}])
    backend = get_backend("ec2")["123456789012"][REGION]

    for vpc_id in vpcs:
        # moto's own lookup: a filter of the id against every tag of the region
        expected = backend.describe_tags(filters={"resource-id": [vpc_id]})
        assert backend.get_vpc(vpc_id).get_tags() == expected
    found = ec2.describe_vpcs(Filters=[{"Name": "tag:lustrain:job", "Values": ["a"]}])["Vpcs"]
    assert sorted(v["VpcId"] for v in found) == sorted(vpcs[:2])
    assert {t["Key"] for v in found if v["VpcId"] == vpcs[1] for t in v["Tags"]} == {"lustrain:job", "Name"}


def test_offerings_filtered_by_type_are_moto_s_own_in_its_order(moto_twin: None) -> None:
    from moto.backends import get_backend
    from moto.ec2.models.instance_types import InstanceTypeOfferingBackend

    backend = get_backend("ec2")["123456789012"][REGION]
    # moto's own method, which the twin's patch wraps (functools.wraps keeps it as __wrapped__)
    moto_s = InstanceTypeOfferingBackend.describe_instance_type_offerings.__wrapped__  # type: ignore[attr-defined]
    for location_type in ("availability-zone", "availability-zone-id", "region"):
        first = INSTANCE_TYPE_OFFERINGS[location_type][REGION][0]["Location"]
        for filters in (
            {"instance-type": ["m5.large", "c5.xlarge", "nothing.large"]},
            {"instance-type": ["p3.2xlarge", "m5.large"], "location": [first]},
            {"location": [first]},
            None,
        ):
            expected = moto_s(backend, location_type, filters)
            assert offerings._moto_answer(backend, location_type, filters) == expected
            assert expected  # each case matches some of the table


def test_the_action_a_request_names_is_found_among_its_class_s_methods_listed_once() -> None:
    dispatch.install()
    import moto.core.responses as responses

    listed = responses.method_names_from_class(EC2Response)  # type: ignore[attr-defined]
    assert listed == method_names_from_class(EC2Response)
    assert listed == [name for name, _ in inspect.getmembers(EC2Response, inspect.isfunction)]
    assert responses.method_names_from_class(EC2Response) is listed  # type: ignore[attr-defined]


def test_a_states_jsonpath_is_parsed_once_and_applied_as_before() -> None:
    asl_parse.install()
    from moto.stepfunctions.parser.asl.utils import json_path

    assert json_path.extract_json("$.job.name", {"job": {"name": "a"}}) == "a"
    assert json_path.parse("$.job.name") is json_path.parse("$.job.name")
    assert json_path.extract_json("$.job.name", {"job": {"name": "b"}}) == "b"


def test_clients_of_a_service_share_one_class_and_keep_their_own_credentials() -> None:
    loaders.install()

    def session(key: str) -> boto3.session.Session:
        return boto3.session.Session(aws_access_key_id=key, aws_secret_access_key=key, region_name=REGION)

    first, second = session("one").client("sagemaker"), session("two").client("sagemaker")
    assert type(first) is type(second)
    assert (first._request_signer._credentials.access_key, second._request_signer._credentials.access_key) == (
        "one",
        "two",
    )
    assert type(session("one").client("ec2")) is not type(first)
    assert hasattr(session("one").client("s3"), "upload_file")  # boto3's methods, added as the class is made


def test_every_session_aliases_event_names_as_botocore_does_and_works_each_out_once() -> None:
    import botocore.hooks

    loaders.install()
    own = botocore.hooks.EventAliaser(botocore.hooks.HierarchicalEmitter())
    own._alias_name_cache = {}  # botocore's own: a cache of its own
    first, second = (boto3.session.Session(region_name=REGION)._session for _ in range(2))
    for name in ("before-call.api.sagemaker.CreateTrainingJob", "needs-retry.s3", "before-send.api.pricing.X"):
        expected = botocore.hooks.EventAliaser._alias_event_name(own, name)
        assert first._events._alias_event_name(name) == second._events._alias_event_name(name) == expected
    assert first._events._alias_name_cache is second._events._alias_name_cache
    assert "before-call.sagemaker.CreateTrainingJob" in first._events._alias_name_cache.values()
    # a client's copy of its session's aliaser shares it too, and other aliases get a cache of their own
    assert boto3.session.Session(region_name=REGION).client("sagemaker").meta.events._alias_name_cache is (
        first._events._alias_name_cache
    )
    other = botocore.hooks.EventAliaser(botocore.hooks.HierarchicalEmitter(), {"api.x": "x"})
    assert other._alias_name_cache is not first._events._alias_name_cache
    assert other._alias_event_name("before-call.api.x.Op") == "before-call.x.Op"


def test_a_large_objects_crc64nvme_read_in_lanes_is_the_byte_loops(monkeypatch: pytest.MonkeyPatch) -> None:
    from lustrain.twin.patches import s3

    looped: list[int] = []  # the bytes each call of the byte loop read
    byte_loop = s3._register
    monkeypatch.setattr(s3, "_register", lambda data, register: looped.append(len(data)) or byte_loop(data, register))
    s3.crc64nvme(bytes(10 * s3.VECTOR_FROM + 3))
    assert sum(looped) < s3.LANE  # only the part lane before the lanes, and the zero byte of the combining maps
    monkeypatch.undo()

    # the catalogue's check value, and one from AWS's CRT (awscrt.checksums.crc64nvme) for 256,004 bytes
    assert s3.crc64nvme(b"123456789") == 0xAE8B14860A799888
    assert s3.crc64nvme(bytes(range(256)) * 1000 + b"tail") == 0x978C088A239892B4
    data = bytes((i * 7919 + i // 256) % 256 for i in range(3 * s3.VECTOR_FROM + 2 * s3.LANE + 5))
    for size in (s3.VECTOR_FROM, s3.VECTOR_FROM + 1, 2 * s3.VECTOR_FROM + s3.LANE - 1, len(data)):
        for before in (0, s3.crc64nvme(b"a first part")):
            # an odd number of lanes, a part lane before them, a CRC continued: each as one byte at a time
            assert s3.crc64nvme(data[:size], before) == s3._register(data[:size], before ^ s3._MASK) ^ s3._MASK


def test_clients_of_a_service_share_one_service_model_that_botocore_would_make() -> None:
    import botocore.model

    loaders.install()

    def sagemaker(key: str) -> Any:
        return boto3.session.Session(aws_access_key_id=key, aws_secret_access_key=key, region_name=REGION).client(
            "sagemaker"
        )

    first, second = sagemaker("one"), sagemaker("two")
    shared = first.meta.service_model
    assert second.meta.service_model is shared
    fresh = botocore.model.ServiceModel(shared._service_description, service_name="sagemaker")
    assert shared.operation_names == fresh.operation_names
    assert shared.endpoint_discovery_operation == fresh.endpoint_discovery_operation
    create = shared.operation_model("CreateTrainingJob")
    assert create.input_shape.members.keys() == fresh.operation_model("CreateTrainingJob").input_shape.members.keys()
    assert first.meta.events is not second.meta.events  # each client still has handlers of its own


def test_whether_a_handler_takes_keyword_arguments_is_botocores_answer() -> None:
    import functools

    from botocore.compat import accepts_kwargs as botocores

    class Handlers:
        def takes(self, **kwargs: Any) -> None: ...

        def refuses(self, event_name: str) -> None: ...

    def plain(**kwargs: Any) -> None: ...

    for handler in (plain, Handlers().takes, Handlers().refuses, functools.partial(plain), lambda x: None, print):
        try:
            expected: Any = botocores(handler)
        except TypeError as error:
            expected = type(error)
        for _ in range(2):  # the second answer is the kept one
            try:
                assert loaders.accepts_kwargs(handler) == expected
            except TypeError as error:
                assert type(error) is expected


def test_an_answers_timestamps_are_the_moments_botocore_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    import datetime as dt

    from botocore.utils import parse_to_aware_datetime
    from botocore.utils import parse_to_aware_datetime as botocore_reads

    from lustrain.twin.patches import answers

    values: list[Any] = [
        "2024-01-01T00:00:00Z",
        "2024-01-01T00:00:00.1Z",
        "2024-02-29T23:59:59.123Z",
        "2024-01-01T10:20:30.123456",
        "2024-01-01 10:20:30",
        "2024-01-01T10:20:30+02:00",
        "2024-01-01T10:20:30.5-05:30",
        "2024-01-01",  # the forms fromisoformat is not asked: botocore's function reads them
        "1700000000",
        "Mon, 01 Jan 2024 00:00:00 GMT",
        1700000000,
        dt.datetime(2024, 1, 1, 12, 0, 0, 250000),
        dt.datetime(2024, 1, 1, 12, tzinfo=dt.timezone(dt.timedelta(hours=3))),
    ]
    asked: list[Any] = []
    monkeypatch.setattr(answers, "parse_to_aware_datetime", lambda value: asked.append(value) or botocore_reads(value))
    for value in values:
        ours, botocores = answers.aware_datetime(value), parse_to_aware_datetime(value)
        assert ours == botocores and ours.utcoffset() == botocores.utcoffset() == dt.timedelta(0), value
        assert ours.strftime("%Y-%m-%dT%H:%M:%S.%fZ") == botocores.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    # botocore's dateutil parse was asked only for what is not an ISO 8601 date and time
    assert asked == values[7:]


def test_an_answers_request_id_is_replaced_as_moto_replaces_it() -> None:
    import re

    from lustrain.twin.patches import answers

    tag_first = answers.TagFirst()
    pattern = answers.REQUEST_ID_PATTERN
    xml = "<R><RequestId>old</RequestId><X>1</X></R>"
    assert tag_first.sub(pattern, "new", xml) == re.sub(pattern, "new", xml) == "<R><RequestId>new</RequestId><X>1</X></R>"
    body = '{"TrainingJobName": "a", "Note": "RequestId"}'
    assert re.sub(pattern, "new", body) == body
    with pytest.MonkeyPatch.context() as patch:  # not searched at all
        patch.setattr(answers.re, "sub", lambda *args, **kwargs: pytest.fail("searched a body without the tag"))
        assert tag_first.sub(pattern, "new", body) is body
    for sub in (tag_first.sub, re.sub):  # a bytes body: each refuses it alike
        try:
            sub(pattern, "new", b"<RequestId>x</RequestId>")
            raise AssertionError("a str expression took a bytes body")
        except TypeError:
            pass
    assert tag_first.sub(r"a+", "b", "caaat") == "cbt" and tag_first.compile is re.compile
