"""A conditional write is atomic on the twin, as on DynamoDB: of writers racing one condition, exactly one wins."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from botocore.exceptions import ClientError
from moto.dynamodb import models
from twinhelpers import key_table

WRITERS = 4


def test_of_writers_racing_one_condition_exactly_one_wins(moto_twin: None, monkeypatch: pytest.MonkeyPatch) -> None:
    ddb = key_table("claims", "id")
    ddb.put_item(TableName="claims", Item={"id": {"S": "run"}})
    parser_of = models.create_condition_expression_parser

    class SlowCondition:
        """The condition as moto evaluates it, then a pause before its write: where two writers would both pass."""

        def __init__(self, op: Any) -> None:
            self.op = op

        def expr(self, item: Any) -> bool:
            passed = bool(self.op.expr(item))
            time.sleep(0.05)
            return passed

    def slow_parser(*args: Any, **kwargs: Any) -> Any:
        parser = parser_of(*args, **kwargs)
        parse = parser.parse
        parser.parse = lambda: SlowCondition(parse())
        return parser

    monkeypatch.setattr(models, "create_condition_expression_parser", slow_parser)

    def claim(writer: int) -> bool:
        try:
            ddb.update_item(
                TableName="claims",
                Key={"id": {"S": "run"}},
                UpdateExpression="SET claimed_by = :w",
                ConditionExpression="attribute_not_exists(claimed_by)",
                ExpressionAttributeValues={":w": {"S": str(writer)}},
            )
            return True
        except ClientError as exc:
            assert exc.response["Error"]["Code"] == "ConditionalCheckFailedException"
            return False

    with ThreadPoolExecutor(WRITERS) as pool:
        won = [writer for writer, ok in zip(range(WRITERS), pool.map(claim, range(WRITERS)), strict=True) if ok]
    assert len(won) == 1
    assert ddb.get_item(TableName="claims", Key={"id": {"S": "run"}})["Item"]["claimed_by"]["S"] == str(won[0])


def test_a_read_never_sees_an_item_half_updated(moto_twin: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """moto applies an update's actions to the stored item one by one; a reader meanwhile sees the item as it was
    before the update or after it, never between (nor fails while the item changes under it)."""
    from moto.dynamodb.parsing import executors

    ddb = key_table("records", "id")
    ddb.put_item(TableName="records", Item={"id": {"S": "run"}, "a": {"N": "0"}, "b": {"N": "0"}})
    executor = executors.UpdateExpressionExecutor
    apply_one = executor.execute

    def slowly(self: Any, node: Any = None) -> None:
        apply_one(self, node)
        if node is not None and self.get_specific_execution(node) is not None:
            time.sleep(0.01)  # between one action and the next: where a reader would see half an update

    monkeypatch.setattr(executor, "execute", slowly)

    def update(value: int) -> None:
        ddb.update_item(
            TableName="records",
            Key={"id": {"S": "run"}},
            UpdateExpression="SET a = :v, b = :v",
            ExpressionAttributeValues={":v": {"N": str(value)}},
        )

    def read(_: int) -> list[tuple[str, str]]:
        seen = []
        for _ in range(20):
            item = ddb.scan(TableName="records")["Items"][0]
            seen.append((item["a"]["N"], item["b"]["N"]))
        return seen

    with ThreadPoolExecutor(4) as pool:
        updates = pool.map(update, range(1, 21))
        reads = pool.map(read, range(2))
        list(updates)
        seen = [pair for result in reads for pair in result]
    assert all(a == b for a, b in seen), [pair for pair in seen if pair[0] != pair[1]]
