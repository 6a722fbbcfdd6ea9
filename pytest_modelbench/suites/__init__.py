"""Built-in benchmark suites with vendored data (no network, no extra package).

``BUILTIN_SUITES`` maps each name usable as an environment's ``module`` to a
factory of a :class:`~pytest_modelbench.suites.contract.Suite`. Data, licences and
checksums are in ``suites/data/`` (rebuilt by ``scripts/vendor_data.py``).
"""

from __future__ import annotations

from collections.abc import Callable

from pytest_modelbench.suites.args import did_you_mean
from pytest_modelbench.suites.coding import MBPP, HumanEval
from pytest_modelbench.suites.contract import Suite, SuiteArgumentError
from pytest_modelbench.suites.gsm8k import GSM8K
from pytest_modelbench.suites.math500 import MATH500
from pytest_modelbench.suites.multiple_choice import MMLU, MedMCQA, MedQA, MMLUMedical
from pytest_modelbench.suites.pubmedqa import PubMedQA

BUILTIN_SUITES: dict[str, Callable[[], Suite]] = {  # classes are the factories
    "gsm8k": GSM8K,
    "math500": MATH500,
    "medqa": MedQA,
    "medmcqa": MedMCQA,
    "pubmedqa": PubMedQA,
    "mmlu": MMLU,
    "mmlu-medical": MMLUMedical,
    "humaneval": HumanEval,
    "mbpp": MBPP,
}


def load_suite(name: str) -> Suite:
    """A fresh suite by registry name; unknown names raise with a did-you-mean hint."""
    factory = BUILTIN_SUITES.get(name)
    if factory is None:
        raise SuiteArgumentError(
            f"unknown built-in suite {name!r}{did_you_mean(name, list(BUILTIN_SUITES))}; "
            f"available: {', '.join(BUILTIN_SUITES)}"
        )
    return factory()


__all__ = ["BUILTIN_SUITES", "load_suite"]
