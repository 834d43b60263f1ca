"""Every botocore session of the twin's process shares one data loader, so a service's model is parsed once, one
service model and one client class per service, so a client's operations and methods are made once, the event
names' aliases, so each is worked out once, and whether a handler takes keyword arguments.

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

Each new client also had a service model of its own, which worked its operations out again from the same JSON: to
find whether the service discovers endpoints it made a model of every operation (700 for EC2), about a twentieth
of the functional tests' CPU. A service model is read-only (its operations and shapes are worked out once and
kept), so the clients of a service share the one made from the shared loader's JSON. And each new session checked,
with inspect, that each of its built-in handlers takes keyword arguments (about a twentieth again): the answer for
a function, or a method of it, is kept.
"""

from __future__ import annotations

import functools
import threading
import types
from collections.abc import Callable
from typing import Any

import botocore.client
import botocore.hooks
import botocore.loaders
import botocore.model
import botocore.session

_create_loader = botocore.loaders.create_loader
_create_client_class = botocore.client.ClientCreator._create_client_class
_aliaser_init = botocore.hooks.EventAliaser.__init__
_accepts_kwargs = botocore.hooks.accepts_kwargs
_PATCHED = "_lustrain_twin_one_class"

_alias_caches_lock = threading.Lock()
#: an aliaser's aliases, as sorted pairs -> the names aliased with them so far (event name -> aliased name)
_alias_caches: dict[tuple[tuple[str, str], ...], dict[str, str]] = {}

_per_model_lock = threading.Lock()
#: (what is kept, service, id of its model's JSON) -> (the model's JSON, kept so that the id stays its own; the thing)
_per_model: dict[tuple[str, str, int], tuple[Any, Any]] = {}


def once_per_model(kind: str, service_name: str, described: Any, make: Callable[[], Any]) -> Any:
    """The `kind` made by `make` for this service's model JSON, made once per JSON (the shared loader's)."""
    key = (kind, service_name, id(described))
    with _per_model_lock:
        found = _per_model.get(key)
    if found is not None and found[0] is described:
        return found[1]
    made = make()
    with _per_model_lock:
        _per_model[key] = (described, made)
    return made


@functools.cache
def shared_loader(search_path_string: str | None = None) -> botocore.loaders.Loader:
    """botocore's loader for this search path, one per process."""
    return _create_loader(search_path_string)


def client_class(creator: botocore.client.ClientCreator, service_name: str, service_model: Any) -> type:
    """botocore's client class for this service's model, made once per model."""
    described = service_model._service_description
    made: type = once_per_model(
        "class", service_name, described, lambda: _create_client_class(creator, service_name, service_model)
    )
    return made


def service_model(
    creator: botocore.client.ClientCreator, service_name: str, api_version: str | None = None
) -> botocore.model.ServiceModel:
    """botocore's service model for this service, one per model JSON the loader gives."""
    described = creator._loader.load_service_model(service_name, "service-2", api_version=api_version)
    made: botocore.model.ServiceModel = once_per_model(
        "model", service_name, described, lambda: botocore.model.ServiceModel(described, service_name=service_name)
    )
    return made


_KWARGS_UNKNOWN = object()
#: a handler's function -> what botocore's accepts_kwargs said of it (the name of its ** parameter, or None)
_kwargs_of: dict[types.FunctionType, Any] = {}


def accepts_kwargs(func: Any) -> Any:
    """botocore's accepts_kwargs, kept for each function (a bound method's, its function's): each new session
    registers the same built-in handlers."""
    key = getattr(func, "__func__", func)
    if not isinstance(key, types.FunctionType):
        return _accepts_kwargs(func)
    found = _kwargs_of.get(key, _KWARGS_UNKNOWN)
    if found is _KWARGS_UNKNOWN:
        found = _kwargs_of[key] = _accepts_kwargs(func)
    return found


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
    botocore.hooks.accepts_kwargs = accepts_kwargs
    botocore.client.ClientCreator._load_service_model = service_model
    if not getattr(botocore.client.ClientCreator._create_client_class, _PATCHED, False):
        setattr(client_class, _PATCHED, True)
        botocore.client.ClientCreator._create_client_class = client_class
