"""Every botocore session of the twin's process shares one data loader, so a service's model is parsed once.

On AWS a Lambda container builds its clients once and keeps them for every invocation it serves. In the twin every
function runs in this one process and each invocation signs with fresh session credentials of its execution role,
so each builds its clients anew (lustrain_core.clients caches them per access key), and each new botocore session
parsed the service's JSON model again: ec2's alone is several megabytes, and a rehearsal spent about a sixth of its
CPU there. The models are read-only data, the same for every session of the process, so one loader serves them all;
what a client signs with, and everything it sends, is unchanged.
"""

from __future__ import annotations

import functools

import botocore.loaders
import botocore.session

_create_loader = botocore.loaders.create_loader


@functools.cache
def shared_loader(search_path_string: str | None = None) -> botocore.loaders.Loader:
    """botocore's loader for this search path, one per process."""
    return _create_loader(search_path_string)


def install() -> None:
    botocore.session.create_loader = shared_loader
