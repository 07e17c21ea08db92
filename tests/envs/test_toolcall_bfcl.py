import json
import re

import pytest

from envs.toolcall.bfcl import (BfclDataMissing, as_tool_calls, bfcl_unavailable, check_calls, load_bfcl, make_task,
                                name_maps, oracle_calls, oracle_coverage, standardize, to_json_schema)

MISSING = bfcl_unavailable()
needs_data = pytest.mark.skipif(MISSING is not None, reason=f"{MISSING}")
BFCL_ONLY_TYPES = {"dict", "float", "tuple", "any", "list", "bool", "double", "long", "char"}


# --- synthetic tasks: the checker's rules, independent of the installed data ---------------------

def _task(functions, ground_truth, category="simple"):
    return make_task({"id": "t", "question": [[{"role": "user", "content": "q"}]], "function": functions},
                     ground_truth, category)


def _fn(name, props, required):
    return {"name": name, "description": "d", "parameters": {"type": "dict", "properties": props, "required": required}}


AREA = _fn("geometry.area", {"base": {"type": "integer"}, "height": {"type": "float"}, "unit": {"type": "string"}},
           ["base", "height"])
CITY = _fn("weather.get", {"city": {"type": "string"}, "days": {"type": "integer"},
                           "fields": {"type": "array", "items": {"type": "string"}}}, ["city"])
AREA_TASK = _task([AREA], [{"geometry.area": {"base": [10], "height": [5.0], "unit": ["units", "cm", ""]}}])


def _call(name, **args):
    return {"name": name, "arguments": args}


def test_name_mapping_round_trips_and_avoids_collisions():
    to_openai, to_bfcl = name_maps(["math.factorial", "plain_name", "a.b.c"])
    assert to_openai == {"math.factorial": "math_factorial", "plain_name": "plain_name", "a.b.c": "a_b_c"}
    assert {to_bfcl[v]: v for v in to_openai.values()} == to_openai
    to_openai, to_bfcl = name_maps(["a.b", "a_b"])  # a.b -> a_b would collide
    assert to_openai == {"a.b": "a-b", "a_b": "a_b"} and to_bfcl == {"a-b": "a.b", "a_b": "a_b"}
    assert AREA_TASK.tools[0]["function"]["name"] == "geometry_area"
    assert AREA_TASK.to_bfcl == {"geometry_area": "geometry.area"}


def test_type_conversion_is_recursive():
    bfcl = {"type": "dict", "required": ["p"], "properties": {
        "p": {"type": "float", "description": "x", "optional": True},
        "t": {"type": "tuple", "items": {"type": "integer"}},
        "anything": {"type": "any", "description": "y"},
        "rows": {"type": "array", "items": {"type": "dict", "properties": {
            "k": {"type": "string", "enum": ["a", "b"]}, "v": {"type": "array", "items": {"type": "float"}}}}},
        "cfg": {"type": "dict", "properties": {"on": {"type": "boolean"}}, "required": ["on"]}}}
    assert to_json_schema(bfcl) == {"type": "object", "required": ["p"], "properties": {
        "p": {"type": "number", "description": "x"},
        "t": {"type": "array", "items": {"type": "integer"}},
        "anything": {"description": "y"},
        "rows": {"type": "array", "items": {"type": "object", "properties": {
            "k": {"type": "string", "enum": ["a", "b"]}, "v": {"type": "array", "items": {"type": "number"}}}}},
        "cfg": {"type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"]}}}
    with pytest.raises(ValueError, match="unknown BFCL type 'quaternion'"):
        to_json_schema({"type": "quaternion"})
    assert AREA_TASK.tools[0]["function"]["parameters"]["properties"]["height"] == {"type": "number"}


def test_standardize_follows_bfcl():
    assert standardize("New York, NY") == standardize("new york ny") == "newyorkny"
    assert standardize("2022-01-01") == standardize("2022/01/01") == "20220101"
    assert standardize("it's") == 'it"s'


def test_checker_accepts_allowed_variants():
    ok = [[_call("geometry_area", base=10, height=5.0)],
          [_call("geometry_area", base=10, height=5)],  # int for float
          [_call("geometry_area", base=10, height=5.0, unit="CM")],  # case-insensitive
          [_call("geometry_area", base=10, height=5.0, unit=" Units.")],  # spaces and punctuation ignored
          as_tool_calls([_call("geometry_area", base=10, height=5.0)])]  # OpenAI shape, JSON string arguments
    assert [check_calls(AREA_TASK, c).ok for c in ok] == [True] * len(ok)


def test_checker_rejects_wrong_calls_with_reasons():
    cases = {
        "unknown function 'geometry.area'": [_call("geometry.area", base=10, height=5.0)],
        "unknown function 'area'": [_call("area", base=10, height=5.0)],
        "parameter 'base': 11 is not among [10]": [_call("geometry_area", base=11, height=5.0)],
        "parameter 'base': expected type integer, got float": [_call("geometry_area", base=10.0, height=5.0)],
        "parameter 'base': expected type integer, got str": [_call("geometry_area", base="10", height=5.0)],
        "parameter 'base': expected type integer, got bool": [_call("geometry_area", base=True, height=5.0)],
        "parameter 'unit': 'inch' is not among": [_call("geometry_area", base=10, height=5.0, unit="inch")],
        "missing required parameter 'height'": [_call("geometry_area", base=10)],
        "unexpected parameter 'color'": [_call("geometry_area", base=10, height=5.0, color="red")],
        "expected 1 call(s), got 2": [_call("geometry_area", base=10, height=5.0)] * 2,
        "expected 1 call(s), got 0": [],
        "arguments are not a JSON object": [{"name": "geometry_area", "arguments": "{broken"}],
    }
    for reason, calls in cases.items():
        result = check_calls(AREA_TASK, calls)
        assert result.ok is False and reason in result.reason, (reason, result.reason)


def test_checker_multiple_needs_the_right_function():
    task = _task([AREA, CITY], [{"weather.get": {"city": ["Paris"], "days": ["", 1]}}], "multiple")
    assert check_calls(task, [_call("weather_get", city="paris")]).ok
    assert check_calls(task, [_call("weather_get", city="Paris", days=1)]).ok
    r = check_calls(task, [_call("geometry_area", base=10, height=5.0)])
    assert (r.ok, r.reason) == (False, "wrong function 'geometry_area', expected 'weather_get'")
    r = check_calls(task, [_call("weather_get", city="Paris", days=2)])
    assert (r.ok, r.reason) == (False, "parameter 'days': 2 is not among ['', 1]")


def test_checker_parallel_any_order_one_to_one():
    gt = [{"weather.get": {"city": ["Paris", "Berlin"], "fields": [["temp"], ""]}},
          {"weather.get": {"city": ["Berlin"], "fields": [["temp"], ""]}}]
    task = _task([CITY], gt, "parallel")
    paris, berlin = _call("weather_get", city="Paris"), _call("weather_get", city="Berlin", fields=["TEMP"])
    assert check_calls(task, [paris, berlin]).ok and check_calls(task, [berlin, paris]).ok
    # a greedy pass would give Berlin to the first answer and fail; a matching finds the fit
    assert check_calls(task, [berlin, _call("weather_get", city="Paris", fields=[])]).ok
    assert check_calls(task, [berlin, berlin]).ok and not check_calls(task, [paris, paris]).ok
    r = check_calls(task, [paris, _call("weather_get", city="Rome")])
    assert not r.ok and "no call matches expected call 1" in r.reason
    assert check_calls(task, [paris]).reason == "expected 2 call(s), got 1"


def test_checker_dict_and_list_of_dict_parameters():
    fn = _fn("book", {"guest": {"type": "dict", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}},
                      "rooms": {"type": "array",
                                "items": {"type": "dict", "properties": {"beds": {"type": "integer"}}}}},
             ["guest"])
    task = _task([fn], [{"book": {"guest": [{"name": ["Ann", "Anna"], "age": ["", 30]}],
                                  "rooms": [[{"beds": [2]}, {"beds": [1]}], ""]}}])
    assert oracle_calls(task) == [_call("book", guest={"name": "Ann"}, rooms=[{"beds": 2}, {"beds": 1}])]
    assert check_calls(task, oracle_calls(task)).ok
    assert check_calls(task, [_call("book", guest={"name": "anna", "age": 30})]).ok
    assert "unexpected key 'pet'" in check_calls(task, [_call("book", guest={"name": "Ann", "pet": "cat"})]).reason
    assert "missing key 'name'" in check_calls(task, [_call("book", guest={"age": 30})]).reason
    assert not check_calls(task, [_call("book", guest={"name": "Ann"}, rooms=[{"beds": 1}, {"beds": 2}])]).ok


def test_oracle_uses_first_allowed_value_and_omits_optional():
    assert oracle_calls(AREA_TASK) == [_call("geometry_area", base=10, height=5.0, unit="units")]
    task = _task([AREA], [{"geometry.area": {"base": [3, 4], "height": [2.5], "unit": ["", "cm"]}}])
    assert oracle_calls(task) == [_call("geometry_area", base=3, height=2.5)]


def test_missing_data_error_names_category_and_place(tmp_path):
    with pytest.raises(BfclDataMissing) as e:
        load_bfcl("parallel", data_dir=tmp_path)
    assert "'parallel'" in str(e.value) and str(tmp_path) in str(e.value) and "BFCL_v<N>_parallel.json" in str(e.value)
    with pytest.raises(ValueError, match="choose one of"):
        load_bfcl("live_simple")


# --- the installed BFCL data --------------------------------------------------------------------

@needs_data
@pytest.mark.parametrize("category", ["simple", "multiple", "parallel"])
def test_load_and_convert_every_task(category):
    tasks = load_bfcl(category)
    assert len(tasks) >= 100 and len({t.id for t in tasks}) == len(tasks)
    assert len(load_bfcl(category, limit=5)) == 5

    def types(schema):
        yield schema.get("type")
        for sub in schema.get("properties", {}).values():
            yield from types(sub)
        if isinstance(schema.get("items"), dict):
            yield from types(schema["items"])

    for t in tasks:
        assert t.messages and t.messages[-1]["role"] == "user" and t.ground_truth
        assert len(t.tools) == len(t.functions) >= (2 if category == "multiple" else 1)
        for tool, fn in zip(t.tools, t.functions):
            name = tool["function"]["name"]
            assert re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name) and t.to_bfcl[name] == fn["name"]
            assert t.to_openai[fn["name"]] == name
            assert tool["function"]["parameters"]["type"] == "object"
            assert not set(types(tool["function"]["parameters"])) & BFCL_ONLY_TYPES
            json.dumps(tool)
    if category == "parallel":
        assert all(len(t.ground_truth) >= 2 for t in tasks)


@needs_data
@pytest.mark.parametrize("category,minimum", [("simple", 0.99), ("multiple", 0.95), ("parallel", 0.95)])
def test_oracle_coverage(category, minimum):
    passed, total, failures = oracle_coverage(category)
    print(f"\nBFCL {category}: checker accepts the oracle on {passed}/{total}")
    for task_id, reason in failures:
        print(f"  {task_id}: {reason}")
    assert passed + len(failures) == total and passed / total >= minimum


@needs_data
def test_checker_rejects_perturbed_oracle_calls():
    """Changing one parameter of the oracle's call to a value outside the allowed ones fails the check."""
    rejected = tried = 0
    for t in load_bfcl("simple"):
        call = oracle_calls(t)[0]
        possible = t.ground_truth[0][t.to_bfcl[call["name"]]]
        for param, value in call["arguments"].items():
            if isinstance(value, bool) or not isinstance(value, (int, str)):
                continue
            wrong = value + 1000 if isinstance(value, int) else value + " zzz"
            if wrong in possible[param]:
                continue
            tried += 1
            rejected += not check_calls(t, [{**call, "arguments": {**call["arguments"], param: wrong}}]).ok
    assert tried > 300 and rejected == tried
    t = load_bfcl("multiple", limit=1)[0]
    other = next(n for n in t.to_bfcl if n != oracle_calls(t)[0]["name"])
    assert "wrong function" in check_calls(t, [{**oracle_calls(t)[0], "name": other}]).reason


def test_not_installed_is_reported_with_the_install_line(monkeypatch):
    import envs.toolcall.bfcl as bfcl

    monkeypatch.setattr(bfcl, "bfcl_data_dir", lambda: None)
    reason = bfcl.bfcl_unavailable()
    assert reason is not None and "'simple'" in reason and "pip install --no-deps bfcl-eval" in reason
