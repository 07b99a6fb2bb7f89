"""Documents asked several questions: quality at equal budget against kvpress's
presses, and what reusing a compressed document saves (issue 49, part 2;
docs/api.md, "Documents and questions").

Workload: three Debian license texts (Apache-2.0, GPL-3, MPL-2.0), each cut
at a paragraph break to at most DOC_TOKENS tokens of the server's tokenizer,
four questions about each, greedy, MAX_NEW new tokens (EOS ends an answer).

1. Quality at budgets C in BUDGETS. Every answer is scored against the
   uncompressed answer of kvpress's own pipeline (kvpress 0.5.5,
   KVPressTextGenerationPipeline, float32 transformers, one subprocess of
   tests/python/reference/kvpress_pipeline_answers.py in .deps/kvpress-venv)
   to the same question: mean token F1 (lower-cased whitespace tokens) and
   the exact-match rate (the same token list).
   * kvpress: the document compressed once by each press (none, keydiff,
     snapkv with window 32 and kernel 7 reading the document's end,
     streaming_llm with 4 sinks, knorm, expected_attention), then each
     question over it.
   * kvpress, snapkv with the question inside the compressed context: one
     prefill per question (the query-aware reference).
   * snapserve (`--precision=exact`, kvpress's float32 numbers) with
     `question`: the document compressed alone and kept by the document
     cache (NONE, KEYDIFF, SNAPKV AVG window 32 kernel 7, STREAMING_LLM 4
     sinks); `oracle_agreement` is the share of answers identical to
     kvpress's answer for the same press and C.
   * snapserve query-aware, recomputed per question: the document and the
     question as one user message without `question`, SNAPKV, so the question
     lies in SnapKV's window and every question pays a full prefill. Its
     `oracle_agreement` is against kvpress's question-in-context run, whose
     window ends before the chat template's end of turn while the server's
     window includes it: close, not identical.
2. Speed (`--precision=auto`, KEYDIFF C=SPEED_BUDGET): per document the
   time to first token of the first question (compresses the document: a
   document cache miss), the median of the other three (hits), and the
   query-aware recompute (one prompt, SNAPKV C=SPEED_BUDGET) of the same
   four questions; client-side, over GenerateStream, after a warm-up on
   another text.

The prefix cache stays off (its default), so nothing but the document cache
reuses work.

  SNAPSERVE_BUILD_DIR=build .venv/bin/python bench/multi_question.py \
      [--out multi_question_avx2.json]

Writes bench/results/runs/multi_question.json (or --out): every answer with
its scores, the per-row means, the speed figures and the machine.
"""
import argparse
import collections
import json
import os
import pathlib
import shlex
import subprocess
import sys
import tempfile
import time

import common

LICENSES = pathlib.Path("/usr/share/common-licenses")
DOC_TOKENS = 1500
MAX_NEW = 32
BUDGETS = (128, 256)
WINDOW, KERNEL, SINKS = 32, 7, 4
SPEED_BUDGET = 256
# The question follows the document inside the same user message; the blank
# line and the label keep it apart from the document's last sentence.
QUESTION_PREFIX = "\n\nQuestion: "
QUESTIONS = {
    "Apache-2.0": [
        "Who is the Licensor?",
        "How long does the copyright license granted by each Contributor last?",
        "When do the patent licenses granted to You terminate?",
        "What must You give any other recipients of the Work when You redistribute it?",
    ],
    "GPL-3": [
        "Who publishes the GNU General Public License?",
        "When we speak of free software, what are we referring to?",
        "What are the two steps that developers who use the GNU GPL take to protect your rights?",
        "What does it mean to convey a work?",
    ],
    "MPL-2.0": [
        "What does Larger Work mean?",
        "Which licenses are Secondary Licenses?",
        "When do the licenses granted in Section 2.1 become effective for a Contribution?",
        "What must You inform recipients of when You distribute Covered Software in Source "
        "Code Form?",
    ],
}
WARMUP_TEXT = "LGPL-2.1"
QUALITY_FLAGS = "--precision=exact --document-cache-memory=0.3"
SPEED_FLAGS = "--precision=auto --document-cache-memory=0.3"
KVPRESS_PYTHON = common.ROOT / ".deps" / "kvpress-venv" / "bin" / "python"
KVPRESS_SCRIPT = common.ROOT / "tests" / "python" / "reference" / "kvpress_pipeline_answers.py"
KVPRESS_PRESSES = ["keydiff", "snapkv", "streaming_llm", "knorm", "expected_attention"]
# The server's method -> the kvpress press it is checked against.
SERVER_METHODS = {"NONE": "none", "KEYDIFF": "keydiff", "SNAPKV": "snapkv",
                  "STREAMING_LLM": "streaming_llm"}


# --- workload -------------------------------------------------------------------

def token_count(stub, text):
    pb2, _ = common.pb()
    return len(stub.Tokenize(pb2.TokenizeRequest(text=text, add_special_tokens=False),
                             timeout=60).ids)


def cut_document(stub, name):
    """The license's longest run of whole paragraphs that stays within
    DOC_TOKENS tokens, without trailing whitespace."""
    text = (LICENSES / name).read_text()
    ends = [i for i in range(1, len(text)) if text[i - 1:i + 1] == "\n\n"]
    lo, hi = 0, len(ends) - 1
    while lo < hi:  # the last paragraph end whose prefix fits
        mid = (lo + hi + 1) // 2
        if token_count(stub, text[:ends[mid]].rstrip()) <= DOC_TOKENS:
            lo = mid
        else:
            hi = mid - 1
    return text[:ends[lo]].rstrip()


def documents(stub):
    return [{"name": name, "text": cut_document(stub, name),
             "questions": [QUESTION_PREFIX + q for q in questions]}
            for name, questions in QUESTIONS.items()]


# --- scores -----------------------------------------------------------------------

def words(text):
    return text.lower().split()


def token_f1(answer, reference):
    a, r = words(answer), words(reference)
    if not a or not r:
        return float(a == r)
    shared = sum((collections.Counter(a) & collections.Counter(r)).values())
    if shared == 0:
        return 0.0
    precision, recall = shared / len(a), shared / len(r)
    return 2 * precision * recall / (precision + recall)


def score(row, reference, oracle=None):
    """Adds each answer's F1 and exact match against `reference` (the
    uncompressed kvpress answers) and, with `oracle`, whether it is
    identical to the oracle's answer; then the row's means."""
    for i, a in enumerate(row["answers"]):
        a["reference"] = reference[i]
        a["f1"] = token_f1(a["answer"], reference[i])
        a["exact"] = words(a["answer"]) == words(reference[i])
        if oracle is not None:
            a["oracle_answer"] = oracle[i]
            a["agrees"] = a["answer"].strip() == oracle[i].strip()
    n = len(row["answers"])
    row["mean_f1"] = sum(a["f1"] for a in row["answers"]) / n
    row["exact_match_rate"] = sum(a["exact"] for a in row["answers"]) / n
    row["oracle_agreement"] = (sum(a["agrees"] for a in row["answers"]) / n
                               if oracle is not None else None)
    return row


# --- kvpress ------------------------------------------------------------------------

def press_config(press, capacity):
    if press == "none":
        return {}
    config = {"capacity": capacity}
    if press == "snapkv":
        config.update(window=WINDOW, kernel_size=KERNEL)
    if press == "streaming_llm":
        config["sink_tokens"] = SINKS
    return config


def kvpress_rows(docs):
    """Every kvpress row, from one subprocess (loading the model is slow)."""
    runs, keys = [], []
    for d in docs:
        runs.append({"press": "none", "config": {}, "context": d["text"],
                     "questions": d["questions"]})
        keys.append(("none", None, "document", d["name"], None))
        for c in BUDGETS:
            for press in KVPRESS_PRESSES:
                runs.append({"press": press, "config": press_config(press, c),
                             "context": d["text"], "questions": d["questions"]})
                keys.append((press, c, "document", d["name"], None))
            for q in d["questions"]:
                # The question inside the compressed context, an empty one after it.
                runs.append({"press": "snapkv", "config": press_config("snapkv", c),
                             "context": d["text"] + q, "questions": [""]})
                keys.append(("snapkv", c, "question_in_context", d["name"], q))
    with tempfile.TemporaryDirectory() as tmp:
        src, out = pathlib.Path(tmp) / "in.json", pathlib.Path(tmp) / "out.json"
        src.write_text(json.dumps({"max_new_tokens": MAX_NEW, "runs": runs}))
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        t0 = time.perf_counter()
        done = subprocess.run([str(KVPRESS_PYTHON), str(KVPRESS_SCRIPT), str(common.model_path()),
                               str(src), str(out)], capture_output=True, text=True, timeout=3600,
                              env=env)
        assert done.returncode == 0, f"kvpress failed:\n{done.stdout}\n{done.stderr}"
        got = json.loads(out.read_text())
        seconds = time.perf_counter() - t0
    rows = {}
    for (press, c, mode, name, q), result in zip(keys, got["results"]):
        row = rows.setdefault((press, c, mode), {
            "system": "kvpress", "method": press, "capacity": c, "mode": mode,
            "config": press_config(press, c), "answers": []})
        questions = [q] if q is not None else next(d["questions"] for d in docs
                                                   if d["name"] == name)
        for question, answer, qt in zip(questions, result["answers"], result["question_tokens"]):
            row["answers"].append({"document": name, "question": question, "answer": answer,
                                   "context_tokens": result["context_tokens"],
                                   "question_tokens": qt})
    versions = {"kvpress": got["kvpress"], "transformers": got["transformers"],
                "seconds": seconds}
    return rows, versions


# --- snapserve ------------------------------------------------------------------------

def kv(method, capacity):
    pb2, _ = common.pb()
    K = pb2.KvCompression
    k = K(method=getattr(K, method))
    if method != "NONE":
        k.max_capacity_prompt = capacity
    if method == "SNAPKV":
        k.window_size, k.kernel_size, k.pooling = WINDOW, KERNEL, K.AVG
    if method == "STREAMING_LLM":
        k.sink_tokens = SINKS
    return k


def request(document, question, method, capacity, one_prompt=False):
    """With `question` (the document compressed alone), or, one_prompt, the
    question appended to the document in one user message."""
    pb2, _ = common.pb()
    content = document + question if one_prompt else document
    return pb2.GenerateRequest(
        messages=pb2.ChatMessages(messages=[pb2.ChatMessage(role="user", content=content)]),
        question="" if one_prompt else question, kv_compression=kv(method, capacity),
        sampling=pb2.SamplingParams(temperature=0.0),
        stopping=pb2.StoppingCriteria(max_new_tokens=MAX_NEW))


def usage(u):
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "cached_prompt_tokens": u.cached_prompt_tokens,
            "document_cache_hit": u.document_cache_hit,
            "kv_kept_entries_total": u.kv_kept_entries_total,
            "time_to_first_token_ms": u.time_to_first_token_ms}


def snapserve_rows(stub, docs):
    rows = {}
    configs = [("NONE", None)] + [(m, c) for c in BUDGETS for m in SERVER_METHODS if m != "NONE"]
    for method, c in configs:
        row = {"system": "snapserve", "method": method, "capacity": c, "mode": "document",
               "flags": QUALITY_FLAGS, "answers": []}
        for d in docs:
            for q in d["questions"]:
                r = stub.Generate(request(d["text"], q, method, c), timeout=900)
                row["answers"].append({"document": d["name"], "question": q, "answer": r.text,
                                       "usage": usage(r.usage)})
        rows[(method, c, "document")] = row
        common.log(f"snapserve {method} C={c} done")
    for c in BUDGETS:
        row = {"system": "snapserve", "method": "SNAPKV", "capacity": c,
               "mode": "question_in_prompt", "flags": QUALITY_FLAGS, "answers": []}
        for d in docs:
            for q in d["questions"]:
                r = stub.Generate(request(d["text"], q, "SNAPKV", c, one_prompt=True), timeout=900)
                row["answers"].append({"document": d["name"], "question": q, "answer": r.text,
                                       "usage": usage(r.usage)})
        rows[("SNAPKV", c, "question_in_prompt")] = row
        common.log(f"snapserve SNAPKV C={c} question in the prompt done")
    return rows


def ttft(stub, req):
    r = common.stream_one(stub, req)
    assert r["error"] is None and r["arrivals"], r["error"]
    return r["arrivals"][0] - r["t0"], r["usage"]


def speed(docs):
    with common.Server(shlex.split(SPEED_FLAGS), log_name="bench-multi-question") as server:
        stub = server.stub
        warm = (LICENSES / WARMUP_TEXT).read_text()[:6000]
        for one_prompt in (False, True):
            method = "SNAPKV" if one_prompt else "KEYDIFF"
            ttft(stub, request(warm, QUESTION_PREFIX + "What is this?", method, SPEED_BUDGET,
                               one_prompt))
        per_doc = []
        for d in docs:
            cached = []
            for q in d["questions"]:
                t, u = ttft(stub, request(d["text"], q, "KEYDIFF", SPEED_BUDGET))
                cached.append({"ttft_s": t, "document_cache_hit": u.document_cache_hit,
                               "cached_prompt_tokens": u.cached_prompt_tokens,
                               "prompt_tokens": u.prompt_tokens})
            recompute = []
            for q in d["questions"]:
                t, u = ttft(stub, request(d["text"], q, "SNAPKV", SPEED_BUDGET, one_prompt=True))
                recompute.append({"ttft_s": t, "prompt_tokens": u.prompt_tokens})
            assert [x["document_cache_hit"] for x in cached] == [False, True, True, True], cached
            first = cached[0]["ttft_s"]
            hits = common.median([x["ttft_s"] for x in cached[1:]])
            again = common.median([x["ttft_s"] for x in recompute])
            per_doc.append({"document": d["name"], "keydiff_requests": cached,
                            "recompute_requests": recompute, "first_ttft_s": first,
                            "hit_ttft_median_s": hits, "recompute_ttft_median_s": again,
                            "first_over_hit": first / hits, "recompute_over_hit": again / hits})
            common.log(f"speed {d['name']}: first {first:.3f}s, hits {hits:.3f}s, "
                       f"recompute {again:.3f}s")
    first = common.median([x["first_ttft_s"] for x in per_doc])
    hits = common.median([x["keydiff_requests"][i]["ttft_s"] for x in per_doc for i in (1, 2, 3)])
    again = common.median([r["ttft_s"] for x in per_doc for r in x["recompute_requests"]])
    return {"flags": SPEED_FLAGS, "capacity": SPEED_BUDGET, "documents": per_doc,
            "first_ttft_median_s": first, "hit_ttft_median_s": hits,
            "recompute_ttft_median_s": again, "first_over_hit": first / hits,
            "recompute_over_hit": again / hits}


# --- report -----------------------------------------------------------------------

def row_name(row):
    if row["mode"] == "question_in_context":
        return f"{row['method']} (question in context)"
    if row["mode"] == "question_in_prompt":
        return f"{row['method']} (question in prompt, per question)"
    return row["method"]


def print_tables(rows, speed_result):
    print(f"\n{'system':<10} {'method':<42} {'C':>4} {'F1':>6} {'EM':>6} {'oracle':>7}")
    for row in rows:
        agree = row["oracle_agreement"]
        print(f"{row['system']:<10} {row_name(row):<42} {row['capacity'] or '-':>4} "
              f"{row['mean_f1']:6.3f} {row['exact_match_rate']:6.3f} "
              f"{'-' if agree is None else f'{agree:.3f}':>7}")
    s = speed_result
    print(f"\nspeed (KEYDIFF C={s['capacity']}, {s['flags']}), TTFT seconds")
    print(f"{'document':<12} {'first':>7} {'hits':>7} {'recompute':>9} {'first/hit':>9} "
          f"{'recompute/hit':>13}")
    lines = [(d["document"], d["first_ttft_s"], d["hit_ttft_median_s"],
              d["recompute_ttft_median_s"], d["first_over_hit"], d["recompute_over_hit"])
             for d in s["documents"]]
    lines.append(("median", s["first_ttft_median_s"], s["hit_ttft_median_s"],
                  s["recompute_ttft_median_s"], s["first_over_hit"], s["recompute_over_hit"]))
    for name, first, hits, again, first_over, again_over in lines:
        print(f"{name:<12} {first:7.3f} {hits:7.3f} {again:9.3f} {first_over:9.2f} "
              f"{again_over:13.2f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="runs/multi_question.json")
    args = ap.parse_args()
    assert KVPRESS_PYTHON.is_file(), f"{KVPRESS_PYTHON} missing: run `scripts/setup.sh kvpress`"
    t0 = time.perf_counter()
    with common.Server(shlex.split(QUALITY_FLAGS), log_name="bench-multi-question") as server:
        docs = documents(server.stub)
        for d in docs:
            d["tokens"] = token_count(server.stub, d["text"])
            common.log(f"{d['name']}: {d['tokens']} tokens")
        common.log("kvpress pipeline runs")
        kv_rows, versions = kvpress_rows(docs)
        common.log(f"kvpress done in {versions['seconds']:.0f}s")
        sv_rows = snapserve_rows(server.stub, docs)
    reference = [a["answer"] for a in kv_rows[("none", None, "document")]["answers"]]
    rows = [score(kv_rows[("none", None, "document")], reference)]
    for c in BUDGETS:
        for press in KVPRESS_PRESSES:
            rows.append(score(kv_rows[(press, c, "document")], reference))
        rows.append(score(kv_rows[("snapkv", c, "question_in_context")], reference))
    for (method, c, mode), row in sv_rows.items():
        if mode == "document":
            oracle = kv_rows[(SERVER_METHODS[method], c, "document")]
        else:
            oracle = kv_rows[("snapkv", c, "question_in_context")]
        rows.append(score(row, reference, [a["answer"] for a in oracle["answers"]]))
    common.log("speed")
    speed_result = speed(docs)
    results = {
        "workload": {"documents": {d["name"]: d["tokens"] for d in docs},
                     "questions_per_document": 4, "max_new_tokens": MAX_NEW, "greedy": True,
                     "question_prefix": QUESTION_PREFIX, "budgets": list(BUDGETS),
                     "snapkv": {"window": WINDOW, "kernel": KERNEL, "pooling": "AVG"},
                     "streaming_llm_sinks": SINKS,
                     "reference": "kvpress pipeline, no press (uncompressed)",
                     "f1": "token F1 over lower-cased whitespace tokens",
                     "exact_match": "the same lower-cased whitespace tokens",
                     "oracle_agreement": "snapserve rows: share of answers identical (stripped) "
                                         "to kvpress's for the same press and C; the query-aware "
                                         "row against kvpress's question-in-context snapkv"},
        "kvpress": versions, "documents": docs, "quality": rows, "speed": speed_result,
        "machine": common.machine_info(), "command": " ".join(sys.argv),
        "seconds": time.perf_counter() - t0}
    print_tables(rows, speed_result)
    common.write_json(args.out, results)


if __name__ == "__main__":
    main()
