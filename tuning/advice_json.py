"""The shape of the advice as JSON: what `iobatch advise --json` prints (tuning.advise.Advice.to_json, its findings
Finding.to_dict, its candidates CandidateResult.to_json) and what `iobatch report --advice FILE` takes back. One
owner for the writer and the reader: tests/unit/test_bad_input_round3_rest.py holds the writer to these tables, and
the reader refuses what does not fit them, so that any JSON object is not shown as a recommendation. Pure.

Fields beyond these (a newer writer's, or `advise --stack`'s source and deploy) are left alone: the report renders
what it knows.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["ADVICE_FIELDS", "CANDIDATE_FIELDS", "FINDING_FIELDS", "advice_problem"]

_NUMBER = (int, float)
_NONE = type(None)

#: Advice.to_json's keys and the JSON kinds each holds.
ADVICE_FIELDS: dict[str, tuple[type, ...]] = {
    "plan": (dict,), "workload": (dict,), "prices": (dict,), "candidates": (list,), "recommended": (str,),
    "untuned_download_s": _NUMBER, "untuned_download_low_s": (*_NUMBER, _NONE),
    "untuned_download_high_s": (*_NUMBER, _NONE), "write_cache": (dict,), "burst": (str,), "comparison": (list,),
    "cdk_context": (dict,), "cdk_args": (str,), "findings": (list,),
}
#: Finding.to_dict's keys and kinds: each of the advice's findings.
FINDING_FIELDS: dict[str, tuple[type, ...]] = {
    "code": (str,), "severity": (str,), "title": (str,), "evidence": (str,), "fix": (str,),
    "cost_s_per_child": (*_NUMBER, _NONE), "cost_usd_per_month": (*_NUMBER, _NONE), "context": (dict,),
    "stage": (str, _NONE), "what_if": (str, _NONE),
}
#: The keys of a candidate the report reads (CandidateResult.to_json writes more).
CANDIDATE_FIELDS: dict[str, tuple[type, ...]] = {
    "volume": (str,), "type": (str,), "download_s": _NUMBER, "steady_download_s": _NUMBER, "fits_day": (bool,),
    "monthly_usd": (*_NUMBER, _NONE),
}
_KIND_NAMES = {dict: "an object", list: "a list", str: "text", int: "a number", float: "a number",
               bool: "true or false", _NONE: "null"}


def _kinds(kinds: tuple[type, ...]) -> str:
    return " or ".join(dict.fromkeys(_KIND_NAMES[k] for k in kinds))


def _fits(value: Any, kinds: tuple[type, ...]) -> bool:
    # JSON's true and false are Python bools, which are ints: a number field does not take them.
    return isinstance(value, kinds) and (bool in kinds or not isinstance(value, bool))


def _problem(body: Mapping[str, Any], fields: Mapping[str, tuple[type, ...]], where: str = "") -> str | None:
    """A field of the wrong kind first (named as `where` + its name), then the fields missing."""
    for name, kinds in fields.items():
        if name in body and not _fits(body[name], kinds):
            return f"{where}{name} is {type(body[name]).__name__}, not {_kinds(kinds)}"
    missing = [name for name in fields if name not in body]
    if missing:
        shown = ", ".join(missing[:4]) + (", ..." if len(missing) > 4 else "")
        return f"{where.rstrip('.') or 'it'} has no {shown}"
    return None


def advice_problem(body: Mapping[str, Any]) -> str | None:
    """Why `body` (a JSON object) is not the advice `advise --json` writes, in words ('it has no findings, cdk_args',
    'findings[2] has no code'), or None when it is."""
    if problem := _problem(body, ADVICE_FIELDS):
        return problem
    for list_name, fields in (("findings", FINDING_FIELDS), ("candidates", CANDIDATE_FIELDS)):
        for index, item in enumerate(body[list_name]):
            if not isinstance(item, dict):
                return f"{list_name}[{index}] is {type(item).__name__}, not an object"
            if problem := _problem(item, fields, f"{list_name}[{index}]."):
                return problem
    if body["candidates"] and not any(c["volume"] == body["recommended"] for c in body["candidates"]):
        return f"recommended {body['recommended'][:40]!r} is none of its candidates"
    return None
