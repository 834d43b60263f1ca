"""A DynamoDB write is atomic with its condition, as on AWS ("Condition expressions": a conditional write succeeds
only if the item's attributes meet the condition when it is made); moto checks a condition and then writes, with
nothing between two threads doing both at once.

The stack relies on it wherever a conditional write decides who goes first: a run recorded once per drop
(records.put_new), the one MLflow run a run keeps (records.claim_mlflow_run), a warm pool's claim, the capacity
queue's line. The twin runs functions in threads of one process, so two of them could both pass one condition and
both write. Every item write of moto's backend (PutItem, UpdateItem, DeleteItem, TransactWriteItems; BatchWriteItem
is a PutItem or DeleteItem per item) now runs under one lock, its condition check included.

A read is never torn on AWS either: an item is read as one write left it. moto's UpdateItem changes the stored
item's attributes in place, so a Scan or Query in another thread could read an item mid-update, or fail ("dictionary
changed size during iteration", seen when `lustrain status` polled while a run's record was written). So every
DynamoDB call moto answers, reads included, is answered under the same lock, its answer written out before another
call changes an item.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

from moto.dynamodb.models import DynamoDBBackend
from moto.dynamodb.responses import DynamoHandler

_PATCHED = "_lustrain_twin_atomic"
#: moto's backend methods that check a condition and change items
WRITES = ("put_item", "update_item", "delete_item", "transact_write_items")

_writes = threading.RLock()


def _atomic(write: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(write)
    def atomic(self: DynamoDBBackend, *args: Any, **kwargs: Any) -> Any:
        with _writes:
            return write(self, *args, **kwargs)

    setattr(atomic, _PATCHED, True)
    return atomic


def install() -> None:
    for name in WRITES:
        write = getattr(DynamoDBBackend, name)
        if not getattr(write, _PATCHED, False):
            setattr(DynamoDBBackend, name, _atomic(write))
    if not getattr(DynamoHandler.call_action, _PATCHED, False):
        DynamoHandler.call_action = _atomic(DynamoHandler.call_action)  # type: ignore[method-assign]
