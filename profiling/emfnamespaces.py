"""The EMF namespaces a reader left out: what `advise` and `report` name when local EMF files hold no stage documents
of the namespace asked for (--namespace, IoBatch unless given), so that the one error line carries the fix.

A stage document is one with a Stage and CloudWatch metric directives (profiling.emf.profile_from_emf reads those of
one namespace and skips the rest); its namespaces are its directives'.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from profiling import runfiles

# At most this many namespaces are named, each cut to this many characters (a foreign file's may be anything).
MAX_NAMED = 5
MAX_CHARS = 60


def stage_namespaces(docs: Iterable[Mapping[str, Any]]) -> set[str]:
    """The namespaces of the stage documents among `docs`."""
    found: set[str] = set()
    for doc in docs:
        meta = doc.get("_aws")
        directives = meta.get("CloudWatchMetrics") if isinstance(meta, Mapping) else None
        if isinstance(doc.get("Stage"), str) and doc["Stage"] and isinstance(directives, list):
            found |= {d["Namespace"] for d in directives
                      if isinstance(d, Mapping) and isinstance(d.get("Namespace"), str) and d["Namespace"]}
    return found


def namespaces_in(files: Iterable[Path]) -> set[str]:
    """The namespaces of the stage documents in EMF `files`, read until MAX_NAMED are found (a fleet's files are not
    all read again for an error's words); a file that cannot be read now is passed over."""
    found: set[str] = set()
    for file in files:
        try:
            found |= stage_namespaces(runfiles.read_emf_documents(file))
        except (OSError, ValueError):
            continue
        if len(found) >= MAX_NAMED:
            break
    return found


def no_stage_documents(where: str, namespace: str, found: Iterable[str]) -> str:
    """The one line for EMF input (`where`) that holds no stage documents of `namespace`: the namespaces it holds
    instead and the --namespace that reads them, or, with none, what to give."""
    names = sorted(name[:MAX_CHARS] for name in set(found) - {namespace})[:MAX_NAMED]
    head = f"{where}: no EMF stage documents of namespace {namespace} (with _aws and Stage) in it"
    if not names:
        return f"{head}: give the EMF files the pipeline's profiler wrote"
    return f"{head}; its stage documents are of namespace {', '.join(names)}: give --namespace {names[0]}"
