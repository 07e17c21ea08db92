"""tau-bench-like shop tasks: database, tools, tasks, grader and scripted agents."""
from envs.toolcall.shop.db import Db, load_db
from envs.toolcall.shop.grader import Grade, expected_db, grade
from envs.toolcall.shop.oracle import oracle_answer, oracle_calls, run_null, run_oracle, run_tool_calls
from envs.toolcall.shop.tasks import SYSTEM_PROMPT, ShopTask, get_task, load_tasks
from envs.toolcall.shop.tools import TOOLS, ToolResult, call_tool

__all__ = ["Db", "load_db", "Grade", "expected_db", "grade", "oracle_answer", "oracle_calls", "run_null",
           "run_oracle", "run_tool_calls", "SYSTEM_PROMPT", "ShopTask", "get_task", "load_tasks", "TOOLS",
           "ToolResult", "call_tool"]
