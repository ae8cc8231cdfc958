"""Stage profiles cut down for readers of a fleet's: without their timelines (without_timeline), or to the fields
one reader needs, for a fleet read in worker processes (profiling.fanout, profiling.runfiles.read_run_profiles).

A worker sends back a plain tuple of those fields a profile, and the reader rebuilds a StageProfile of them: a
StageProfile pickles and unpickles field by field in Python (dataclasses' __getstate__ and __setstate__, ~30 us a
profile between the two processes), a tuple of figures in a few, and the worker need not build the profile at all.

The reader names its fields (the advisor: tuning.advise.ADVISOR_FIELDS). Every other field of a rebuilt profile is
StageProfile's default, and its `calls` keep only their figures per call type (metrics.by_call, what a reader of
per-stage figures reads of them): a profile read so serves that reader alone.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from profiling.metrics import BY_CALL, StageProfile, by_call

_FIELDS = {spec.name: spec for spec in dataclasses.fields(StageProfile)}
_REQUIRED = tuple(name for name, spec in _FIELDS.items()
                  if spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING)


def without_timeline(body: dict[str, Any]) -> dict[str, Any]:
    """A decoded profile line without its timeline, and its strings and source maps shared with the profiles
    that repeat them: a profile then weighs about 1.5 KiB instead of 10 (runfiles.profile_from_line)."""
    body["timeline"] = []
    body["properties"] = {sys.intern(k): sys.intern(v) for k, v in (body.get("properties") or {}).items()}
    body["sources"] = _shared(body.get("sources") or {})
    return body


@functools.lru_cache(maxsize=256)
def _shared_sources(items: tuple[tuple[str, str], ...]) -> dict[str, str]:
    return dict(items)


def _shared(sources: dict[str, Any]) -> dict[str, Any]:
    """One dict for every profile with the same sources (they are not changed after reading)."""
    try:
        return _shared_sources(tuple(sources.items()))
    except TypeError:  # a value that is not hashable: leave it as it is
        return sources


def _default(name: str) -> Any:
    spec = _FIELDS[name]
    if spec.default_factory is not dataclasses.MISSING:
        return spec.default_factory()
    return spec.default


@dataclass(frozen=True)
class ProfileFields:
    """The fields of a stage profile a reader needs: all that read workers send back of each profile."""

    names: tuple[str, ...]

    def __post_init__(self) -> None:
        unknown = [name for name in self.names if name not in _FIELDS]
        if unknown:
            raise ValueError(f"StageProfile has no field {', '.join(unknown)}")
        if len(set(self.names)) != len(self.names):
            raise ValueError("a field is named twice")
        if missing := [name for name in _REQUIRED if name not in self.names]:
            raise ValueError(f"a profile cannot be built without {', '.join(missing)}")

    @functools.cached_property
    def _calls(self) -> int | None:
        return self.names.index("calls") if "calls" in self.names else None

    def _sent(self, values: list[Any]) -> tuple[Any, ...]:
        at = self._calls
        if at is not None and values[at]:
            values[at] = {BY_CALL: by_call(values[at])}
        return tuple(values)

    def of_line(self, body: Mapping[str, Any]) -> tuple[Any, ...]:
        """The fields of a profile line as profiling.runfiles decoded and checked it; one it lacks is its default."""
        return self._sent([body[name] if name in body else _default(name) for name in self.names])

    def of_profile(self, profile: StageProfile) -> tuple[Any, ...]:
        """The fields of a profile (one read from EMF)."""
        return self._sent([getattr(profile, name) for name in self.names])

    @functools.cached_property
    def _arguments(self) -> tuple[list[Any], list[int]]:
        """StageProfile's arguments, each field at its default (the empty lists and dicts one for every profile built
        here: a reduced profile's are not changed), and the place of each of `names` among them."""
        shared: dict[Any, Any] = {dict: {}, list: []}
        defaults = [None if name in self.names else spec.default if spec.default is not dataclasses.MISSING
                    else shared[spec.default_factory] for name, spec in _FIELDS.items()]
        return defaults, [list(_FIELDS).index(name) for name in self.names]

    def profile(self, values: Sequence[Any]) -> StageProfile:
        """The profile of these fields' values (of_line, of_profile), every other field at its default."""
        arguments, places = self._arguments
        arguments = arguments.copy()
        for place, value in zip(places, values, strict=True):
            arguments[place] = value
        return StageProfile(*arguments)
