"""Scorers on realistic model outputs, including the adversarial ones.

Each family has at least 15 cases: the instructed format, common phrasings,
reasoning before the answer, thinking tags, markdown, LaTeX, distractor
numbers or letters, and truncated or empty replies.
"""

from __future__ import annotations

import pytest

from pytest_modelbench.suites.contract import Example
from pytest_modelbench.suites.extract import extract_choice, strip_thinking
from pytest_modelbench.suites.gsm8k import GSM8K
from pytest_modelbench.suites.math500 import MATH500
from pytest_modelbench.suites.multiple_choice import MedQA
from pytest_modelbench.suites.pubmedqa import PubMedQA

# --------------------------------------------------------------------------- thinking


@pytest.mark.parametrize(
    ("raw", "visible"),
    [
        ("<think>It is 20? No, 18.</think>\n\n#### 18", "#### 18"),
        ("Let me see.</think>The answer is B", "The answer is B"),  # template pre-filled <think>
        ("<think>\nstill thinking about options A and C", ""),  # ran out of tokens
        ("<THINK>x</THINK>Answer: C", "Answer: C"),
        ("<thinking>a</thinking>yes<reasoning>b</reasoning>", "yes"),
        ("no tags at all", "no tags at all"),
        (
            "<|channel|>analysis<|message|>maybe 7<|end|><|start|>assistant"
            "<|channel|>final<|message|>#### 8<|return|>",
            "#### 8",
        ),
    ],
)
def test_strip_thinking(raw: str, visible: str) -> None:
    assert strip_thinking(raw) == visible


# --------------------------------------------------------------------------- GSM8K

GSM8K_GOLD = Example(id="gsm8k/test/0", messages=(), gold="18")


@pytest.mark.parametrize(
    ("completion", "accuracy", "strict", "flexible"),
    [
        ("Janet sells 16 - 3 - 4 = 9 eggs.\nShe makes 9 * 2 = $18.\n#### 18", 1, 1, 1),
        ("16 - 3 - 4 = 9 eggs, 9 * $2 = $18 per day.\nThe answer is 18.", 1, 1, 1),
        ("#### 18.00", 1, 1, 1),
        ("She earns $18 every day.", 1, 0, 1),  # no format: flexible only
        ("The answer is 18, not 20.", 1, 1, 0),  # last number is a distractor
        ("9 eggs at $2 each: 9 * 2 = 18 dollars. Checking with 20 - 2 = 18.", 1, 0, 1),
        ("<think>Maybe 16 - 3 = 13, times 2 = 26? No.</think>\n#### 18", 1, 1, 1),
        ("<think>9 * 2 = 18</think>\nI am not sure.", 0, 0, 0),  # answer only inside thoughts
        ("She makes \\(\\frac{36}{2}\\) dollars.\n#### \\frac{36}{2}", 1, 1, 1),  # LaTeX fraction
        ("Final answer: **18**", 1, 1, 1),
        ("So she makes $\\boxed{18}$ dollars.", 1, 1, 1),
        ("#### $18", 1, 1, 1),
        ("16 eggs - 7 = 9; 9 x 2 = 18. She sells 9 eggs.", 0, 0, 0),  # flexible reads 9
        ("#### 26", 0, 0, 0),
        ("The answer is 18.\n\nHowever, if she sold 10 eggs it would be 20.", 1, 1, 0),
        ("", 0, 0, 0),
        ("I cannot determine this.", 0, 0, 0),
        ("#### 1,8", 0, 0, 0),  # not a number format
    ],
)
def test_gsm8k_scorer(completion: str, accuracy: int, strict: int, flexible: int) -> None:
    score = GSM8K().score(GSM8K_GOLD, completion)
    assert score.metrics == {
        "accuracy": accuracy,
        "exact_match_strict": strict,
        "exact_match_flexible": flexible,
    }


def test_gsm8k_thousands_and_negative_numbers() -> None:
    suite = GSM8K()
    big = Example(id="x", messages=(), gold="114200")
    assert suite.score(big, "Total: $114,200.\n#### 114,200").metrics["accuracy"] == 1
    negative = Example(id="y", messages=(), gold="-5")
    assert suite.score(negative, "The temperature dropped to −5 degrees.").metrics["accuracy"] == 1
    assert suite.score(negative, "It is 3-5 = -2 … #### -5").metrics["exact_match_strict"] == 1


# --------------------------------------------------------------------------- MATH-500


def _math(gold: str) -> Example:
    return Example(id="math500/test/x", messages=(), gold=gold)


@pytest.mark.parametrize(
    ("gold", "completion", "correct"),
    [
        ("\\frac{1}{2}", "The probability is $\\boxed{\\frac{1}{2}}$.", 1),
        ("\\frac{1}{2}", "So the answer is $\\boxed{0.5}$", 1),
        ("\\frac{1}{2}", "$\\boxed{\\dfrac12}$", 1),
        (
            "\\frac{1}{2}",
            "First I thought $\\boxed{\\frac13}$, but recounting: $\\boxed{\\frac{2}{4}}$",
            1,
        ),
        ("\\frac{1}{2}", "The answer is $\\boxed{\\frac{1}{3}}$", 0),
        ("\\frac{14}{3}", "<think>maybe 5</think>\nThus $x = \\boxed{\\frac{14}{3}}$.", 1),
        ("\\frac{14}{3}", "<think>so it is \\boxed{\\frac{14}{3}}</think> I am unsure.", 0),
        ("\\left( 3, \\frac{\\pi}{2} \\right)", "Polar: $\\boxed{(3, \\frac{\\pi}{2})}$", 1),
        ("\\left( 3, \\frac{\\pi}{2} \\right)", "Polar: $\\boxed{(3, \\pi)}$", 0),
        ("x=5", "Solving gives $\\boxed{5}$.", 1),
        ("11\\sqrt2", "The length is $\\boxed{11\\sqrt{2}}$.", 1),
        ("11\\sqrt2", "The length is $\\boxed{\\sqrt{242}}$.", 1),
        ("90^\\circ", "The angle measures $\\boxed{90}$ degrees.", 1),
        ("[2,5)", "The domain is $\\boxed{[2,5)}$.", 1),
        ("[2,5)", "The domain is $\\boxed{[2,5]}$.", 0),
        ("\\text{Evelyn}", "Evelyn has the highest average speed: $\\boxed{\\text{Evelyn}}$", 1),
        ("10", "Final Answer: The final answer is $10$. I hope it is correct.", 1),
        ("10", "", 0),
        ("10", "\\boxed{" + "(" * 2000, 0),  # malformed, must not raise or hang
    ],
)
def test_math500_scorer(gold: str, completion: str, correct: int) -> None:
    assert MATH500().score(_math(gold), completion).metrics["accuracy"] == correct


# --------------------------------------------------------------------------- multiple choice

OPTIONS = [
    "Diltiazem",
    "Labetalol",
    "Nitroglycerin",
    "Propranolol",
    "Reassurance and continuous monitoring",
]
MC_GOLD = Example(id="medqa/test/5", messages=(), gold={"answer": "C", "options": OPTIONS})


@pytest.mark.parametrize(
    ("completion", "letter"),
    [
        ("Answer: C", "C"),
        ("Answer: (C)", "C"),
        ("**C**", "C"),
        ("C) Nitroglycerin", "C"),
        ("C", "C"),
        ("Cocaine causes vasospasm, so beta-blockers (B, D) are contraindicated.\nAnswer: C", "C"),
        ("Let me reason. A is a calcium channel blocker. B is mixed.\nThe answer is C.", "C"),
        ("<think>Answer: B? No, B is a beta blocker.</think>\nAnswer: C", "C"),
        ("**Final Answer:** (C) Nitroglycerin", "C"),
        ("The correct option is C because it relieves coronary vasospasm.", "C"),
        ("$\\boxed{C}$", "C"),
        ("\\boxed{\\text{C}}", "C"),
        ("I would go with C.", "C"),
        ("The best first step is nitroglycerin.", "C"),  # option text, no letter
        ("answer: c", "C"),
        ('So, the answer is "C" (Nitroglycerin).', "C"),  # seen from SmolLM2-135M
        ("So the answer is 'C'.", "C"),
        (  # the last line names two options; its last sentence names one
            "Labetalol is risky with cocaine. Therefore, the best first step is Nitroglycerin.",
            "C",
        ),
        ("Based on the given options, the most appropriate drug is C.", "C"),  # SmolLM2-135M
        ("Both Labetalol and Nitroglycerin lower the pressure.", None),  # two options, one sentence
        ('The answer is "A good question", says the attending.', None),  # unclosed quote: no letter
        ("Answer: B\n\nWait, labetalol is risky here. Final answer: C", "C"),
        ("A patient using cocaine needs benzodiazepines first.", None),  # 'A' is an article
        ("Answer: F", None),  # not an option
        ("<think>It should be C", None),  # truncated while thinking
        ("", None),
    ],
)
def test_multiple_choice_letter_extraction(completion: str, letter: str | None) -> None:
    assert extract_choice(completion, OPTIONS) == letter
    score = MedQA().score(MC_GOLD, completion)
    assert score.metrics["accuracy"] == float(letter == "C")
    assert score.metrics["answered"] == float(letter is not None)


def test_multiple_choice_only_accepts_existing_letters() -> None:
    four = OPTIONS[:4]
    assert extract_choice("Answer: E", four) is None
    assert extract_choice("Answer: D", four) == "D"


# --------------------------------------------------------------------------- PubMedQA

PUBMED_GOLD = Example(id="pubmedqa/test/1", messages=(), gold="no")


@pytest.mark.parametrize(
    ("completion", "label"),
    [
        ("Answer: no", "no"),
        ("No. The trial found no significant difference.\nAnswer: no", "no"),
        ("No, the data do not support this.", "no"),
        ("The results show no benefit, so the answer is no.", "no"),
        ("**No**", "no"),
        ("Answer: **No**", "no"),
        ("The answer is: No", "no"),
        ("<think>Yes? The abstract says yes in places.</think>\nAnswer: no", "no"),
        ("$\\boxed{no}$", "no"),
        ("Final answer: no.", "no"),
        ("Yes, mitochondria play a role.\nAnswer: yes", "yes"),
        ("The evidence is mixed.\nAnswer: maybe", "maybe"),
        ("Maybe — the sample is too small to conclude.", "maybe"),
        ("There were no adverse events; overall the answer is yes.", "yes"),
        ("The study design does not allow a conclusion either way.", None),
        ("yes or no? It depends.", "yes"),  # leading word is read as the answer
        ("", None),
    ],
)
def test_pubmedqa_extraction(completion: str, label: str | None) -> None:
    score = PubMedQA().score(PUBMED_GOLD, completion)
    assert score.extracted == label
    assert score.metrics["accuracy"] == float(label == "no")


# --------------------------------------------------------------------------- degenerate output

DEGENERATE = [
    "\n" * 20000,
    " " * 20000,
    "Answer:" + " " * 20000 + "x",
    "Answer:" + "\n" * 20000 + "x",
    "A)" + "\n " * 10000 + "x",
    "\\boxed{" * 3000,
    "<think>" * 3000,
    "</think>" * 3000,
    "```" * 7000,
    "1," * 10000,
    "####" * 5000,
    "*" * 20000,
    "(" * 20000,
    ("\n" + " " * 10) * 2000 + "Z",
]


@pytest.mark.parametrize("suite_class", [GSM8K, MATH500, MedQA, PubMedQA])
def test_degenerate_outputs_score_zero_without_blowing_up(suite_class: type) -> None:
    """Repetition loops of small models: every scorer stays linear and returns a score."""
    suite = suite_class()
    example = suite.examples({}, 0)[0]
    for completion in DEGENERATE:
        score = suite.score(example, completion)
        assert score.metrics[suite.primary_metric] == 0.0
