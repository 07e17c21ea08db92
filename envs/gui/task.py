"""What a GUI task is: its site, how an episode starts and ends, how it is judged, and its scripted solutions."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from envs.gui.observation import parse
from envs.gui.site import Post, Site


@dataclass
class FinalState:
    """What the judge sees once the episode is over."""

    url: str
    observation: str  # the last accessibility tree shown (or taken at the end)
    posts: list[Post]
    answer: Optional[str]  # what `submit` gave; None when the agent never submitted
    page_state: Any = None  # the task's `state_js`, evaluated in the final page

    def posted(self, path: str) -> list[dict[str, str]]:
        """The forms POSTed to `path`, in order."""
        return [p.form for p in self.posts if p.path == path]


@dataclass(frozen=True)
class Verdict:
    passed: bool
    reason: str


@dataclass(frozen=True)
class Target:
    """An element as a scripted agent finds it in an observation: its role and accessible name."""

    role: str
    name: str = ""
    exact: bool = True  # False: the observed name contains `name`
    nth: int = 0  # which of the matching elements, in page order (0: the first)
    text: bool = False  # True: `name` is matched against the element's text (`- generic [ref=e5]: Submit`)


@dataclass(frozen=True)
class Step:
    """One scripted tool call; `target` becomes the call's `id` once found in the current observation."""

    tool: str
    args: dict[str, str] = field(default_factory=dict)
    target: Optional[Target] = None


# A scripted solution: given the instruction, the current observation and the step number, the next step
# (None: stop). A fixed list of steps is the common case (`steps`).
Plan = Callable[[str, str, int], Optional[Step]]


def steps(*plan: Step) -> Plan:
    return lambda instruction, observation, k: plan[k] if k < len(plan) else None


@dataclass
class GuiTask:
    id: str
    category: str
    site: Site
    start_path: str
    judge: Callable[[FinalState], Verdict]
    instruction: str = ""  # "": the page gives it (`instruction_js`)
    instruction_js: str = ""
    start_js: str = ""  # run once the first page has loaded (MiniWoB: seed, then start the episode)
    ready_js: str = ""  # polled after start_js until true
    observe: str = "body"  # the part of the page shown to the agent (a CSS selector)
    done_js: str = ""  # true once the page says the task is over: the episode ends
    state_js: str = ""  # what the judge reads from the final page
    max_turns: int = 10
    oracle: Optional[Plan] = None
    wrong: Optional[Plan] = None  # a plausible wrong solution, which must fail


def elements(observation: str) -> list[tuple[str, str, str, str]]:
    """Every element of `observation` with an id, in page order: (role, name, id, text)."""
    return [(e.role, e.name, e.ref, e.text or "") for e in parse(observation) if e.ref]


def find_element(observation: str, target: Target) -> Optional[str]:
    """The id of the target's element in `observation`: the `nth` with the target's role and name (or text)."""
    matches = [ref for role, name, ref, text in elements(observation) if role == target.role
               and ((text if target.text else name) == target.name if target.exact
                    else target.name in (text if target.text else name))]
    return matches[target.nth] if target.nth < len(matches) else None
