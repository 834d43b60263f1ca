"""Every botocore session of the twin's process shares one data loader, so a service's model is parsed once, one
client class per service, so a client's methods are made once, and the event names' aliases, so each is worked
out once.

On AWS a Lambda container builds its clients once and keeps them for every invocation it serves. In the twin every
function runs in this one process and each invocation signs with fresh session credentials of its execution role,
so each builds its clients anew (lustrain_core.clients caches them per access key), and each new botocore session
parsed the service's JSON model again: ec2's alone is several megabytes, and a rehearsal spent about a sixth of its
CPU there. The models are read-only data, the same for every session of the process, so one loader serves them all;
what a client signs with, and everything it sends, is unchanged.

A client's class (a method and its docstring for each of the service's operations, 700 for EC2) was then made again
for each client: half of a client's creation, and about a tenth of the functional tests' CPU. The class depends on
the service's model alone (and on the handlers of `creating-client-class`, boto3's own and the same in every session
of the process), so each service's class is made once, for its model as the shared loader gives it. Each client is
still an instance of its own, with its own credentials, configuration, endpoint and event handlers.

Each session and each client has an event aliaser of its own, which rewrites an event's name by botocore's aliases
(`api.sagemaker` is `sagemaker`, ...) before it registers or emits it, and keeps the answers; a new one starts with
none, so every new session's hundreds of built-in handlers and every new client's first calls split and compared
each name against every alias again: about a sixteenth of the twin's CPU in the end-to-end tests. The answer
depends on the name and the aliases alone, so every aliaser with the same aliases shares one cache.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

import botocore.client
import botocore.hooks
import botocore.loaders
import botocore.session

_create_loader = botocore.loaders.create_loader
_create_client_class = botocore.client.ClientCreator._create_client_class
_aliaser_init = botocore.hooks.EventAliaser.__init__
_PATCHED = "_lustrain_twin_one_class"

_alias_caches_lock = threading.Lock()
#: an aliaser's aliases, as sorted pairs -> the names aliased with them so far (event name -> aliased name)
_alias_caches: dict[tuple[tuple[str, str], ...], dict[str, str]] = {}

_classes_lock = threading.Lock()
#: (service, id of its model's JSON) -> (the model's JSON, kept so that the id stays its own; the class)
_classes: dict[tuple[str, int], tuple[Any, type]] = {}


@functools.cache
def shared_loader(search_path_string: str | None = None) -> botocore.loaders.Loader:
    """botocore's loader for this search path, one per process."""
    return _create_loader(search_path_string)


def client_class(creator: botocore.client.ClientCreator, service_name: str, service_model: Any) -> type:
    """botocore's client class for this service's model, made once per model."""
    described = service_model._service_description
    key = (service_name, id(described))
    with _classes_lock:
        found = _classes.get(key)
    if found is not None and found[0] is described:
        return found[1]
    made: type = _create_client_class(creator, service_name, service_model)
    with _classes_lock:
        _classes[key] = (described, made)
    return made


def alias_cache(aliases: dict[str, str]) -> dict[str, str]:
    """The one cache of aliased event names for these aliases."""
    key = tuple(sorted(aliases.items()))
    with _alias_caches_lock:
        return _alias_caches.setdefault(key, {})


def _init_aliaser(self: botocore.hooks.EventAliaser, event_emitter: Any, event_aliases: Any = None) -> None:
    _aliaser_init(self, event_emitter, event_aliases)
    self._alias_name_cache = alias_cache(self._event_aliases)


def install() -> None:
    botocore.session.create_loader = shared_loader
    botocore.hooks.EventAliaser.__init__ = _init_aliaser
    if not getattr(botocore.client.ClientCreator._create_client_class, _PATCHED, False):
        setattr(client_class, _PATCHED, True)
        botocore.client.ClientCreator._create_client_class = client_class
