"""BFCL (Berkeley Function Calling Leaderboard) single-turn tasks as OpenAI tool-call tasks.

The data ships inside the `bfcl-eval` wheel (`pip install --no-deps bfcl-eval`); nothing of
BFCL is imported, only its JSON files are read. Three pieces:

- `load_bfcl(category)`: tasks of "simple", "multiple" or "parallel" with their OpenAI tool
  schemas. BFCL function names may contain dots, which OpenAI names cannot; each task keeps
  the mapping both ways (`math.factorial` <-> `math_factorial`).
- `check_calls(task, calls)`: BFCL's AST check, reimplemented. A call must name the expected
  function, give every required parameter, give only parameters of the possible answer, give
  each a value of the right type (an int is accepted for a float) that is among the allowed
  values, and omit only parameters whose allowed values include "" (BFCL's "optional").
  Strings compare as BFCL does: case-insensitive, ignoring spaces and ,./-_*^, ' equal to ".
  Parallel calls match the possible answers in any order (a one-to-one matching, where BFCL
  matches greedily and so rejects a few orderings that do fit).
- `oracle_calls(task)` / `oracle_coverage(category)`: calls built from the first allowed
  value of every parameter, and how many of them the checker accepts.
"""
from __future__ import annotations

import copy
import importlib.util
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

INSTALL_HINT = "pip install --no-deps bfcl-eval"
# BFCL v4 renamed "simple" to "simple_python" (adding java/javascript); v3 files are named plainly.
CATEGORY_STEMS: dict[str, tuple[str, ...]] = {
    "simple": ("simple_python", "simple"), "multiple": ("multiple",), "parallel": ("parallel",)}

# BFCL's type names -> JSON Schema; None means any type (no "type" key).
JSON_TYPES: dict[str, Optional[str]] = {
    "dict": "object", "object": "object", "float": "number", "number": "number", "double": "number",
    "integer": "integer", "long": "integer", "string": "string", "char": "string", "boolean": "boolean",
    "bool": "boolean", "array": "array", "list": "array", "tuple": "array", "any": None}
# ... and -> the Python type a value must have (as BFCL's checker: "any" is checked as a string).
PY_TYPES: dict[str, type] = {
    "dict": dict, "object": dict, "float": float, "number": float, "double": float, "integer": int,
    "long": int, "string": str, "char": str, "boolean": bool, "bool": bool, "array": list, "list": list,
    "tuple": list, "any": str}
_NOT_JSON_SCHEMA = {"optional"}  # BFCL annotations that JSON Schema does not have


class BfclDataMissing(FileNotFoundError):
    pass


@dataclass
class BfclTask:
    id: str
    category: str
    messages: list[dict]  # the user turn (OpenAI messages)
    functions: list[dict]  # BFCL's function docs, as shipped
    tools: list[dict]  # the same as OpenAI tool schemas (OpenAI names)
    ground_truth: list[dict[str, dict[str, list]]]  # [{bfcl_name: {param: [allowed values]}}]
    to_openai: dict[str, str]  # BFCL name -> OpenAI name
    to_bfcl: dict[str, str]  # OpenAI name -> BFCL name

    def function(self, bfcl_name: str) -> dict:
        return next(f for f in self.functions if f["name"] == bfcl_name)


@dataclass
class CheckResult:
    ok: bool
    reason: str  # "" when ok


# --- data files ----------------------------------------------------------------------------------

def bfcl_data_dir() -> Optional[Path]:
    """The data folder of the installed bfcl-eval package (found without importing it), or None."""
    spec = importlib.util.find_spec("bfcl_eval")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / "data"


def bfcl_unavailable() -> Optional[str]:
    """Why BFCL data cannot be loaded (for test skips), or None when it can."""
    try:
        for category in CATEGORY_STEMS:
            data_files(category)
    except BfclDataMissing as e:
        return str(e)
    return None


def _version(path: Path) -> int:
    return int(re.match(r"BFCL_v(\d+)_", path.name).group(1))


def data_files(category: str, data_dir: Optional[Path] = None) -> tuple[Path, Path]:
    """(questions, possible answers) for a category, newest BFCL version first."""
    if category not in CATEGORY_STEMS:
        raise ValueError(f"BFCL category {category!r} is not supported; choose one of {list(CATEGORY_STEMS)}")
    data_dir = data_dir or bfcl_data_dir()
    if data_dir is None:
        raise BfclDataMissing(f"BFCL data for category {category!r}: the bfcl-eval package is not installed "
                              f"(install it with `{INSTALL_HINT}`)")
    patterns = [f"BFCL_v<N>_{stem}.json" for stem in CATEGORY_STEMS[category]]
    for stem in CATEGORY_STEMS[category]:
        # exact names only: BFCL_v*_multiple.json would also match BFCL_v4_live_multiple.json
        found = [q for q in data_dir.glob("BFCL_v*.json") if re.fullmatch(rf"BFCL_v\d+_{stem}\.json", q.name)]
        for q in sorted(found, key=_version, reverse=True):
            a = data_dir / "possible_answer" / q.name
            if a.exists():
                return q, a
    raise BfclDataMissing(f"BFCL data for category {category!r} not found: looked for {' or '.join(patterns)} "
                          f"and possible_answer/ beside it in {data_dir}")


def _jsonl(path: Path) -> list[dict]:
    # split on "\n" only: str.splitlines() would also break at U+2028 inside a JSON string
    return [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]


# --- names and schemas ---------------------------------------------------------------------------

def _plain_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", name)[:64]


def name_maps(names: list[str]) -> tuple[dict[str, str], dict[str, str]]:
    """(BFCL -> OpenAI, OpenAI -> BFCL) for one task's functions.

    Dots become underscores, as BFCL itself does for OpenAI models. When that would make two
    names equal (`a.b` next to `a_b`) the dotted one keeps its dots as hyphens instead, which
    BFCL names never contain, so the mapping stays one-to-one and reversible.
    """
    plain = [_plain_name(n) for n in names]
    to_openai: dict[str, str] = {}
    for name, p in zip(names, plain):
        if plain.count(p) > 1 and p != name:
            p = name.replace(".", "-")
        to_openai[name] = p
    to_bfcl = {v: k for k, v in to_openai.items()}
    if len(to_bfcl) != len(to_openai) or not all(re.fullmatch(r"[A-Za-z0-9_-]{1,64}", v) for v in to_bfcl):
        raise ValueError(f"cannot map BFCL function names {names} to distinct OpenAI names")
    return to_openai, to_bfcl


def to_json_schema(schema: dict) -> dict:
    """A BFCL parameter schema as JSON Schema: dict->object, float->number, tuple->array, any->no type."""
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "type":
            if value not in JSON_TYPES:
                raise ValueError(f"unknown BFCL type {value!r}")
            if JSON_TYPES[value]:
                out["type"] = JSON_TYPES[value]
        elif key == "properties" and isinstance(value, dict):
            out[key] = {k: to_json_schema(v) for k, v in value.items()}
        elif key == "items" and isinstance(value, dict):
            out[key] = to_json_schema(value)
        elif key not in _NOT_JSON_SCHEMA:
            out[key] = copy.deepcopy(value)
    return out


def to_openai_tool(function: dict, name: str) -> dict:
    params = to_json_schema(function.get("parameters", {"type": "dict", "properties": {}}))
    params["type"] = "object"
    return {"type": "function", "function": {
        "name": name, "description": function.get("description", ""), "parameters": params}}


# --- loading ------------------------------------------------------------------------------------

def load_bfcl(category: str, limit: Optional[int] = None, data_dir: Optional[Path] = None) -> list[BfclTask]:
    """The tasks of one BFCL single-turn category ("simple", "multiple", "parallel"), in file order."""
    questions_path, answers_path = data_files(category, data_dir)
    answers = {a["id"]: a["ground_truth"] for a in _jsonl(answers_path)}
    return [make_task(q, answers[q["id"]], category) for q in _jsonl(questions_path)[:limit]]


def make_task(question: dict, ground_truth: list[dict], category: str) -> BfclTask:
    """One task from a BFCL question row ({"id", "question", "function"}) and its possible answer."""
    functions = question["function"]
    to_openai, to_bfcl = name_maps([f["name"] for f in functions])
    return BfclTask(id=question["id"], category=category, messages=list(question["question"][0]),
                    functions=functions, tools=[to_openai_tool(f, to_openai[f["name"]]) for f in functions],
                    ground_truth=ground_truth, to_openai=to_openai, to_bfcl=to_bfcl)


# --- checking -----------------------------------------------------------------------------------

def standardize(text: str) -> str:
    """BFCL's string normal form: no spaces or ,./-_*^, lower case, ' as "."""
    return re.sub(r"[ ,./\-_*^]", "", text).lower().replace("'", '"')


def _std(value: Any) -> Any:
    return standardize(value) if isinstance(value, str) else value


def _std_list(values: list) -> list:
    return [_std(v) for v in values]


def _as_list(v: Any) -> list:
    return v if isinstance(v, list) else [v]


def _dict_error(param: str, value: dict, allowed: list) -> Optional[str]:
    """A dict value against allowed dicts of {key: [allowed values]}; None when one of them fits."""
    error = f"parameter {param!r}: no allowed value"
    for alt in allowed:
        if not isinstance(alt, dict):
            continue
        extra = [k for k in value if k not in alt]
        wrong = [k for k in value if k in alt and _std(value[k]) not in _std_list(_as_list(alt[k]))]
        missing = [k for k, v in alt.items() if k not in value and "" not in _as_list(v)]
        if extra:
            error = f"parameter {param!r}: unexpected key {extra[0]!r}"
        elif wrong:
            error = f"parameter {param!r}: key {wrong[0]!r} has value {value[wrong[0]]!r}, allowed {alt[wrong[0]]}"
        elif missing:
            error = f"parameter {param!r}: missing key {missing[0]!r}"
        else:
            return None
    return error


def _item_type_ok(value: Any, spec: dict, allowed: list) -> bool:
    """One level of element type checking for lists, as BFCL does."""
    item_type = spec.get("items", {}).get("type")
    if item_type not in PY_TYPES:
        return True
    want = PY_TYPES[item_type]
    seen = {type(x) for alt in allowed if isinstance(alt, list) for x in alt}  # the answer's own types
    return all(type(x) is want or (want is float and type(x) is int) or type(x) in seen for x in value)


def _value_error(param: str, value: Any, allowed: list, spec: dict) -> Optional[str]:
    """Why `value` is not an allowed value of `param`, or None."""
    bfcl_type = spec.get("type", "any")
    want = PY_TYPES.get(bfcl_type, str)
    if want is float and type(value) is int:
        value = float(value)
    answer_type = next((type(a) for a in allowed if a != ""), None)
    # BFCL: when the possible answer's values have another type than the schema says, they are
    # "variables" compared plainly, and a value of the answer's type is accepted.
    is_variable = answer_type is not None and answer_type is not want
    if type(value) is want:
        if want is list and not _item_type_ok(value, spec, allowed):
            return f"parameter {param!r}: an element of {value!r} has the wrong type (expected {spec['items']['type']})"
    elif not (answer_type is not None and type(value) is answer_type):
        return f"parameter {param!r}: expected type {bfcl_type}, got {type(value).__name__} ({value!r})"
    else:
        is_variable = True
    if not is_variable:
        if want is dict:
            return _dict_error(param, value, allowed)
        if want is list and spec.get("items", {}).get("type") in ("dict", "object"):
            for alt in allowed:
                if isinstance(alt, list) and len(alt) == len(value) and \
                        all(_dict_error(param, v, [a]) is None for v, a in zip(value, alt)):
                    return None
            return f"parameter {param!r}: {value!r} matches no allowed list of dicts"
        if want is str:
            ok = standardize(value) in [standardize(a) for a in allowed if isinstance(a, str)]
            return None if ok else f"parameter {param!r}: {value!r} is not among {allowed} (case-insensitive)"
        if want is list:
            # as in BFCL, an empty list counts as leaving out a parameter whose allowed values include ""
            alts = [[] if a == "" else _std_list(a) for a in allowed if a == "" or isinstance(a, list)]
            ok = _std_list(value) in alts
            return None if ok else f"parameter {param!r}: {value!r} is not among {allowed}"
    return None if value in allowed else f"parameter {param!r}: {value!r} is not among {allowed}"


def _call_error(task: BfclTask, answer: dict[str, dict[str, list]], name: str, args: dict) -> Optional[str]:
    """Why one call does not match one possible answer, or None."""
    expected = next(iter(answer))
    called = task.to_bfcl.get(name)
    if called is None:
        return f"unknown function {name!r}; offered: {sorted(task.to_bfcl)}"
    if called != expected:
        return f"wrong function {name!r}, expected {task.to_openai[expected]!r}"
    possible = answer[expected]
    function = task.function(expected)
    props = function.get("parameters", {}).get("properties", {})
    for param in function.get("parameters", {}).get("required", []):
        if param not in args:
            return f"missing required parameter {param!r}"
    for param, value in args.items():
        if param not in props or param not in possible:
            return f"unexpected parameter {param!r}"
        error = _value_error(param, value, possible[param], props[param])
        if error:
            return error
    for param, allowed in possible.items():
        if param not in args and "" not in allowed:
            return f"missing parameter {param!r} (the possible answer does not make it optional)"
    return None


def _normalize_call(call: dict) -> tuple[str, Any]:
    f = call.get("function", call)  # OpenAI tool_call or {"name", "arguments"}
    args = f.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            args = None
    return str(f.get("name", "")), args


def _match(ok: list[list[bool]]) -> Optional[list[int]]:
    """A perfect matching answers -> calls (augmenting paths), or None."""
    owner: dict[int, int] = {}

    def assign(i: int, seen: set[int]) -> bool:
        for j, fits in enumerate(ok[i]):
            if fits and j not in seen:
                seen.add(j)
                if j not in owner or assign(owner[j], seen):
                    owner[j] = i
                    return True
        return False

    if not all(assign(i, set()) for i in range(len(ok))):
        return None
    return [j for i in range(len(ok)) for j, o in owner.items() if o == i]


def check_calls(task: BfclTask, calls: list[dict]) -> CheckResult:
    """Grade a model's calls (`{"name", "arguments"}` dicts or OpenAI tool calls) against the possible answers."""
    parsed = [_normalize_call(c) for c in calls]
    for i, (name, args) in enumerate(parsed):
        if not isinstance(args, dict):
            return CheckResult(False, f"call {i} ({name}): arguments are not a JSON object")
    answers = task.ground_truth
    if len(parsed) != len(answers):
        return CheckResult(False, f"expected {len(answers)} call(s), got {len(parsed)}")
    errors = [[_call_error(task, answer, name, args) for name, args in parsed] for answer in answers]
    if _match([[e is None for e in row] for row in errors]) is not None:
        return CheckResult(True, "")
    if len(answers) == 1:
        return CheckResult(False, str(errors[0][0]))
    # name the first expected call that no call can satisfy, else report an unresolvable assignment
    for i, row in enumerate(errors):
        if all(e is not None for e in row):
            return CheckResult(False, f"no call matches expected call {i} ({next(iter(answers[i]))}): {row}")
    return CheckResult(False, "calls fit the expected calls individually but not one-to-one")


# --- oracle -------------------------------------------------------------------------------------

_OMIT = object()


def _first(allowed: Any, spec: dict, required: bool) -> Any:
    """The first allowed value, built out for dicts ({key: [allowed]}) and lists of dicts."""
    if not isinstance(allowed, list):  # a literal inside a dict answer
        return allowed
    values = [a for a in allowed if a != ""] if (required or not allowed or allowed[0] != "") else []
    if not values:
        return _OMIT
    value = values[0]
    kind = spec.get("type")
    if kind in ("dict", "object") and isinstance(value, dict):
        return _build_dict(value, spec)
    if kind in ("array", "list", "tuple") and isinstance(value, list) and \
            spec.get("items", {}).get("type") in ("dict", "object"):
        return [_build_dict(v, spec["items"]) if isinstance(v, dict) else v for v in value]
    return value


def _build_dict(answer: dict, spec: dict) -> dict:
    props = spec.get("properties", {})
    built = {k: _first(v, props.get(k, {}), required=False) for k, v in answer.items()}
    return {k: v for k, v in built.items() if v is not _OMIT}


def oracle_calls(task: BfclTask) -> list[dict]:
    """`{"name", "arguments"}` calls from the first allowed value of every parameter ("" first: omitted)."""
    calls = []
    for answer in task.ground_truth:
        name, possible = next(iter(answer.items()))
        params = task.function(name).get("parameters", {})
        required = set(params.get("required", []))
        args = {p: _first(v, params.get("properties", {}).get(p, {}), p in required) for p, v in possible.items()}
        calls.append({"name": task.to_openai[name], "arguments": {k: v for k, v in args.items() if v is not _OMIT}})
    return calls


def as_tool_calls(calls: list[dict]) -> list[dict]:
    """`{"name", "arguments"}` calls as OpenAI assistant tool calls (arguments as JSON strings)."""
    return [{"id": f"call_{i}", "type": "function",
             "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])}} for i, c in enumerate(calls)]


def oracle_coverage(category: str, limit: Optional[int] = None) -> tuple[int, int, list[tuple[str, str]]]:
    """(passed, total, [(task id, reason)]) of the checker on the oracle's calls."""
    tasks = load_bfcl(category, limit)
    failures = []
    for task in tasks:
        result = check_calls(task, oracle_calls(task))
        if not result.ok:
            failures.append((task.id, result.reason))
    return len(tasks) - len(failures), len(tasks), failures
