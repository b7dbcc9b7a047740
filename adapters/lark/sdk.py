"""The two parts of lark-oapi the adapter uses, imported without running ``lark_oapi/__init__.py``.

That ``__init__`` imports every model of every API the SDK covers (about 5 s of CPU, and 15 to 20 s
of a busy machine, at every daemon start); the adapter needs only the long connection's protobuf
``Frame`` (``lark_oapi.ws.pb.pbbp2_pb2``) and the callback cipher (``lark_oapi.core.utils.decryptor``),
which import nothing of the rest.  While they load, ``lark_oapi`` and ``lark_oapi.ws`` stand in
``sys.modules`` as bare packages (their ``__init__`` not run) and are taken out again afterwards, so
whatever imports ``lark_oapi`` later in the process gets the whole SDK, reusing these two modules.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType

__all__ = ["AESCipher", "Frame"]

_BARE = ("lark_oapi", "lark_oapi.ws")  # the packages whose __init__ pulls in everything


def _load(*names: str) -> list[ModuleType]:
    if "lark_oapi" in sys.modules:  # the SDK is loaded already: nothing to save
        return [importlib.import_module(name) for name in names]
    placed = []
    try:
        for package in _BARE:
            spec = importlib.util.find_spec(package)
            if spec is None or spec.submodule_search_locations is None:
                raise ImportError(f"{package} is not installed (the switchboard[lark] extra)")
            sys.modules[package] = importlib.util.module_from_spec(spec)
            placed.append(package)
        return [importlib.import_module(name) for name in names]
    finally:
        for package in placed:
            sys.modules.pop(package, None)


_frames, _decryptor = _load("lark_oapi.ws.pb.pbbp2_pb2", "lark_oapi.core.utils.decryptor")
Frame = _frames.Frame
AESCipher = _decryptor.AESCipher
