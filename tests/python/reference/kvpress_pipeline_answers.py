"""kvpress's own pipeline answering several questions about one document, as
JSON: the oracle for the server's document requests (a request with a
`question`, docs/api.md "Documents and questions").

Runs in .deps/kvpress-venv (scripts/setup.sh kvpress), like
kvpress_kept_positions.py, whose press constructors and model loading it
shares:

    python kvpress_pipeline_answers.py MODEL.gguf IN.json OUT.json

IN.json:  {"max_new_tokens": N,
           "runs": [{"press": "none" | a kvpress_kept_positions.PRESSES name
                              | "knorm" | "expected_attention",
                     "config": {"capacity": C, ...the press's fields},
                     "context": text, "questions": [text, ...]}, ...]}
OUT.json: {"kvpress": version, "transformers": version,
           "results": [{"context_tokens": n, "question_tokens": [q, ...],
                        "answers": [text, ...]}, ...]}

kvpress's KVPressTextGenerationPipeline renders the context as a user message
with the model's chat template, compresses it once with the press while it is
prefilled, then for each question runs the question (with the template's end
of turn) over the compressed cache and decodes greedily, dropping the answer
from the cache before the next question. The budget C becomes the ratio that
keeps exactly C of the context's n tokens, as in kvpress_kept_positions.py.
"""
import json
import os
import pathlib
import sys

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing may be downloaded
os.environ["TQDM_DISABLE"] = "1"

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from kvpress_kept_positions import PRESSES, load_model, ratio_keeping  # noqa: E402


def knorm(config, n):
    from kvpress import KnormPress
    ratio = ratio_keeping(n, config["capacity"])
    return KnormPress(compression_ratio=ratio), ratio


def expected_attention(config, n):
    from kvpress import ExpectedAttentionPress
    ratio = ratio_keeping(n, config["capacity"])
    return ExpectedAttentionPress(compression_ratio=ratio), ratio


ALL_PRESSES = dict(PRESSES, knorm=knorm, expected_attention=expected_attention)


def restore_pretokenizer(tokenizer):
    """SmolLM2's original pre-tokenizer (its GGUF says tokenizer.ggml.pre =
    "smollm"): transformers' GGUF conversion replaces it by plain ByteLevel,
    which splits digits and runs of spaces differently
    (test_tokenizer_parity.py documents the difference)."""
    from tokenizers import pre_tokenizers
    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])


def main(model_path, in_path, out_path):
    from importlib.metadata import version
    import kvpress  # noqa: F401  (registers the "kv-press-text-generation" pipeline)
    from transformers import AutoTokenizer, pipeline
    spec = json.loads(pathlib.Path(in_path).read_text())
    model = load_model(model_path)
    path = pathlib.Path(model_path)
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    restore_pretokenizer(tokenizer)
    pipe = pipeline("kv-press-text-generation", model=model, tokenizer=tokenizer, device="cpu")
    results = []
    for run in spec["runs"]:
        inputs = pipe.preprocess(run["context"], run["questions"], answer_prefix="",
                                 max_context_length=10**9)
        n = inputs["context_ids"].shape[1]
        press = None
        if run["press"] != "none":
            press, _ = ALL_PRESSES[run["press"]](run["config"], n)
        out = pipe(run["context"], questions=run["questions"], press=press,
                   max_new_tokens=spec["max_new_tokens"])
        results.append({"context_tokens": n,
                        "question_tokens": [q.shape[1] for q in inputs["questions_ids"]],
                        "answers": out["answers"]})
    pathlib.Path(out_path).write_text(json.dumps({
        "kvpress": version("kvpress"), "transformers": version("transformers"),
        "results": results}))


if __name__ == "__main__":
    torch.manual_seed(0)
    with torch.no_grad():
        main(*sys.argv[1:4])
