"""Built-in benchmark suites with vendored data (no network, no extra package).

``BUILTIN_SUITES`` maps each name usable as an environment's ``module`` to a
factory of a :class:`~pytest_modelbench.suites.contract.Suite`. Data, licences and
checksums are in ``suites/data/`` (rebuilt by ``scripts/vendor_data.py``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping

from pytest_modelbench.suites.args import did_you_mean
from pytest_modelbench.suites.contract import Suite, SuiteArgumentError


class SuiteRegistry(Mapping[str, Callable[[], Suite]]):
    """Name → suite class, each class's module imported when the class is first looked up.

    An item runs one suite: importing every one (the code suites load the sandbox) would
    cost every benchmark session's start-up. Names and their order are known without an
    import; a looked-up class is the module's own (``BUILTIN_SUITES[name] is type(suite)``).
    """

    def __init__(self, where: Mapping[str, tuple[str, str]]) -> None:
        self._where = dict(where)  # name -> (module in this package, class name)

    def __getitem__(self, name: str) -> Callable[[], Suite]:
        module, attr = self._where[name]
        # lazily: a suite's module loads when its class is first asked for (start-up time)
        loaded = importlib.import_module(f"{__name__}.{module}")
        factory: Callable[[], Suite] = getattr(loaded, attr)
        return factory

    def __contains__(self, name: object) -> bool:
        return name in self._where  # without importing the suite's module

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)


BUILTIN_SUITES: Mapping[str, Callable[[], Suite]] = SuiteRegistry(  # classes are the factories
    {
        "gsm8k": ("gsm8k", "GSM8K"),
        "math500": ("math500", "MATH500"),
        "medqa": ("multiple_choice", "MedQA"),
        "medmcqa": ("multiple_choice", "MedMCQA"),
        "pubmedqa": ("pubmedqa", "PubMedQA"),
        "mmlu": ("multiple_choice", "MMLU"),
        "mmlu-medical": ("multiple_choice", "MMLUMedical"),
        "humaneval": ("coding", "HumanEval"),
        "mbpp": ("coding", "MBPP"),
    }
)


def load_suite(name: str) -> Suite:
    """A fresh suite by registry name; unknown names raise with a did-you-mean hint."""
    if name not in BUILTIN_SUITES:
        raise SuiteArgumentError(
            f"unknown built-in suite {name!r}{did_you_mean(name, list(BUILTIN_SUITES))}; "
            f"available: {', '.join(BUILTIN_SUITES)}"
        )
    return BUILTIN_SUITES[name]()


__all__ = ["BUILTIN_SUITES", "SuiteRegistry", "load_suite"]
