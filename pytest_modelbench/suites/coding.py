"""Code-generation suites: HumanEval (164) and MBPP (500), run in the sandbox.

The reply's code (the fenced block that defines the function, or a raw
completion of the prompt) runs in :mod:`pytest_modelbench.sandbox`, and the
benchmark's tests are run against it by the sandbox's judge, in a process the
code cannot reach (a program that exits early, prints what a passing run
prints or returns an object equal to everything fails). The code runs only with
full OS isolation (bubblewrap or our own namespaces: a root without this
package's data, the run store or the home directory), unless the user accepts
the audit-hook sandbox (``--mb-allow-weak-sandbox``); each row's ``detail`` and
the item's summary (:meth:`CodeSuite.summary_fields`) say which. ``pass@1`` is per
completion; with ``rollouts_per_example > 1`` :meth:`CodeSuite.aggregate` adds
the unbiased ``pass@k`` estimator of Chen et al. (2021) for every k up to the
rollouts.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from pytest_modelbench.sandbox import (
    HiddenTests,
    SandboxLimits,
    default_sandbox,
    require_full_isolation,
)
from pytest_modelbench.suites.args import Arg
from pytest_modelbench.suites.base import SYSTEM_PROMPT_ARG, BuiltinSuite, num_fewshot_arg
from pytest_modelbench.suites.contract import Example, Score
from pytest_modelbench.suites.extract import extract_code
from pytest_modelbench.suites.prompting import chat, plain

PASS_AT = (2, 5, 10, 20, 50, 100)
MAX_EXTRACTED_CHARS = 4000

HUMANEVAL_INSTRUCTION = (
    "Complete the following Python function. Reply with the complete function, including "
    "the signature and any imports it needs, in a single ```python code block.\n\n"
    "```python\n{prompt}```"
)
MBPP_INSTRUCTION = (
    "You are an expert Python programmer. Write a Python function for this task:\n{text}\n"
    "{tests}Reply with the code in a single ```python code block."
)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``c`` passed: 1 - C(n-c, k) / C(n, k)."""
    if n - c < k:
        return 1.0
    result = 1.0
    for i in range(n - c + 1, n + 1):
        result *= 1.0 - k / i
    return 1.0 - result


def timeout_arg() -> Arg:
    return Arg("timeout", "int", 10, "seconds of CPU time per program (1..300)", 1, 300)


class CodeSuite(BuiltinSuite):
    """Shared scoring of the code suites; subclasses build programs."""

    primary_metric = "pass@1"
    metrics: tuple[str, ...] = ("pass@1",)
    blocking_score = True
    version = "2"  # 2: code sees the standard library only (no host packages such as numpy)

    def preflight(self) -> None:
        """Refuse before any request when generated code would run without OS isolation
        and the user did not accept it (:class:`~pytest_modelbench.sandbox.WeakSandboxError`)."""
        require_full_isolation(default_sandbox(), self.name)

    def summary_fields(self) -> dict[str, Any]:
        """``{"sandbox": ...}`` for the item's summary: the isolation level this process's
        sandbox gives (``bwrap``, ``namespaces`` or ``audit-hook``), whether it is full,
        the interpreter, and why stronger levels were not available."""
        return {"sandbox": default_sandbox().describe()}

    def score(self, example: Example, completion: str) -> Score:
        program, tests, code = self.program_and_tests(example, completion)
        seconds = int(example.gold.get("timeout", 10))
        limits = SandboxLimits(cpu_seconds=seconds, wall_seconds=2.0 * seconds + 5.0)
        sandbox = default_sandbox()
        require_full_isolation(sandbox, self.name)  # never runs code with less, unaccepted
        result = sandbox.run_tests(program, tests, limits=limits)
        detail = result.to_json()
        detail.pop("stdout_tail", None)
        return Score(
            metrics={"pass@1": float(result.passed)},
            extracted=code[:MAX_EXTRACTED_CHARS],
            detail=detail,
        )

    def program_and_tests(self, example: Example, completion: str) -> tuple[str, HiddenTests, str]:
        """The program (the reply's code and what it needs), the benchmark's tests the
        judge runs against it, and the code read from the completion."""
        raise NotImplementedError

    def program_and_code(self, example: Example, completion: str) -> tuple[str, str]:
        """One self-contained program (code and tests, for :meth:`Sandbox.run`, whose
        exit code the program controls: scoring uses :meth:`program_and_tests`) and the
        code read from the completion."""
        raise NotImplementedError

    def aggregate(
        self, rows_by_example: Mapping[str, Sequence[Mapping[str, float]]]
    ) -> dict[str, float]:
        """Mean unbiased pass@k over examples, for each k up to the smallest rollout count."""
        counts = [
            (len(rows), sum(1 for row in rows if row.get("pass@1", 0.0) >= 0.5))
            for rows in rows_by_example.values()
            if rows
        ]
        if not counts:
            return {}
        smallest = min(n for n, _ in counts)
        return {
            f"pass@{k}": sum(pass_at_k(n, c, k) for n, c in counts) / len(counts)
            for k in PASS_AT
            if k <= smallest
        }


class HumanEval(CodeSuite):
    name = "humaneval"
    tokens_per_example = 500
    data_file = "humaneval/test.jsonl.gz"

    def arg_specs(self) -> tuple[Arg, ...]:
        return (num_fewshot_arg(0), SYSTEM_PROMPT_ARG, timeout_arg())

    def build(self, args: Mapping[str, Any], seed: int) -> list[Example]:  # noqa: ARG002  # BuiltinSuite.build signature; only shuffling suites read seed
        examples = []
        for record in self.records:
            messages = chat(
                HUMANEVAL_INSTRUCTION.format(prompt=record["prompt"]), (), args["system_prompt"]
            )
            examples.append(
                Example(
                    id=str(record["id"]),
                    messages=messages,
                    gold={
                        "prompt": record["prompt"],
                        "test": record["test"],
                        "entry_point": record["entry_point"],
                        "timeout": args["timeout"],
                    },
                    prompt=str(record["prompt"]),  # classic completion-style prompt
                )
            )
        return examples

    def program_and_tests(self, example: Example, completion: str) -> tuple[str, HiddenTests, str]:
        gold = example.gold
        entry = str(gold["entry_point"])
        code = extract_code(completion, entry)
        if re.search(rf"^[ \t]*def\s+{re.escape(entry)}\s*\(", code, re.M):
            # a whole function: keep the prompt first for its imports and helper functions
            body = f"{gold['prompt']}    pass\n\n{code}"
        else:  # a continuation of the prompt (completions endpoint)
            body = f"{gold['prompt']}{code}"
        # the judge runs the prompt too: its helpers (poly, encode_cyclic) stay the dataset's
        tests = HiddenTests(
            cases=(f"check({entry})",),
            prelude=f"{gold['prompt']}\n\n{gold['test']}\n",
            bind=(entry,),
        )
        return body, tests, code

    def program_and_code(self, example: Example, completion: str) -> tuple[str, str]:
        body, tests, code = self.program_and_tests(example, completion)
        return f"{body}\n\n{example.gold['test']}\n\n{tests.cases[0]}\n", code

    def reference_completion(self, example: Example) -> str:
        record = self.record(example)
        return f"```python\n{record['prompt']}{record['canonical_solution']}```"

    def wrong_completion(self, example: Example) -> str:
        gold = example.gold
        return f"```python\n{gold['prompt']}    raise NotImplementedError\n```"


def _function_name(record: Mapping[str, Any]) -> str | None:
    """The function the tests call, among those the reference code defines."""
    defined = re.findall(r"^def\s+(\w+)\s*\(", str(record["code"]), re.M)
    tests = "\n".join(record["test_list"])
    called = [name for name in defined if re.search(rf"\b{re.escape(name)}\s*\(", tests)]
    names: list[str] = called or defined
    return names[0] if names else None


class MBPP(CodeSuite):
    name = "mbpp"
    tokens_per_example = 400
    data_file = "mbpp/test.jsonl.gz"
    fewshot_file = "mbpp/fewshot.jsonl.gz"

    def arg_specs(self) -> tuple[Arg, ...]:
        show = Arg("show_tests", "bool", True, "list the test asserts in the prompt (standard)")
        return (num_fewshot_arg(3), SYSTEM_PROMPT_ARG, timeout_arg(), show)

    def build(self, args: Mapping[str, Any], seed: int) -> list[Example]:  # noqa: ARG002  # BuiltinSuite.build signature; only shuffling suites read seed
        shots = [
            (
                MBPP_INSTRUCTION.format(text=shot["text"], tests=""),
                f"```python\n{shot['code']}\n```",
            )
            for shot in self.fewshot[: args["num_fewshot"]]
        ]
        examples = []
        for record in self.records:
            tests = "\n".join(record["test_list"])
            shown = (
                f"Your code should pass these tests:\n\n{tests}\n\n" if args["show_tests"] else ""
            )
            user = MBPP_INSTRUCTION.format(text=record["text"], tests=shown)
            messages = chat(user, shots, args["system_prompt"])
            examples.append(
                Example(
                    id=str(record["id"]),
                    messages=messages,
                    gold={
                        "tests": list(record["test_list"]),
                        "setup": record["test_setup_code"],
                        "entry_point": _function_name(record),
                        "timeout": args["timeout"],
                    },
                    prompt=plain(messages),
                    meta={"task_id": record["task_id"]},
                )
            )
        return examples

    def program_and_tests(self, example: Example, completion: str) -> tuple[str, HiddenTests, str]:
        gold = example.gold
        entry = gold.get("entry_point")
        code = extract_code(completion, entry)
        # bound even where it shadows a builtin (mbpp/test/126 tests a function named sum)
        tests = HiddenTests(cases=tuple(gold["tests"]), bind=(str(entry),) if entry else ())
        # the setup builds inputs from the reply's classes (mbpp/test/367's trees): it runs
        # with the program, and the judge receives what it made as objects it can only pass
        return f"{code}\n\n{gold['setup']}\n", tests, code

    def program_and_code(self, example: Example, completion: str) -> tuple[str, str]:
        program, tests, code = self.program_and_tests(example, completion)
        return "\n".join([program, *tests.cases, ""]), code

    def reference_completion(self, example: Example) -> str:
        return f"```python\n{self.record(example)['code']}\n```"

    def wrong_completion(self, example: Example) -> str:
        name = example.gold.get("entry_point") or "solution"
        return f"```python\ndef {name}(*args, **kwargs):\n    raise NotImplementedError\n```"
