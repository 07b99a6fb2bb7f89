"""The varied text corpus the tokenizer parity tests encode: real text and
code (Debian's license texts, this repository's sources), hand-picked edge
cases and random mixtures of Unicode categories, emoji, digits, whitespace and
a model's special-token texts. Shared by test_tokenizer_parity.py (byte-level
BPE) and test_sentencepiece_parity.py.
"""
import pathlib
import random
import unicodedata

ROOT = pathlib.Path(__file__).resolve().parents[2]
# SmolLM2's special tokens (the default specials pool).
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<repo_name>", "<file_sep>",
            "<jupyter_code>", "<empty_output>"]


def _char_pools(specials):
    rng = random.Random(7)
    bmp = []
    while len(bmp) < 400:  # assigned, encodable BMP code points of every category
        cp = rng.randrange(0x80, 0x10000)
        if unicodedata.category(chr(cp)) not in ("Cn", "Cs", "Co"):
            bmp.append(chr(cp))
    return {
        "ascii": [chr(c) for c in range(0x20, 0x7F)],
        "letters": list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"),
        "digits": list("0123456789") + ["٣", "²", "Ⅻ", "½", "७", "０", "𝟙"],
        "space": [" ", " ", " ", "\t", "\n", "\n", "\r", "\u00a0", "\u3000", "\u2009", "\x0b",
                  "\x0c", "\x85", "\u2028"],
        "cjk": [chr(c) for c in range(0x4E00, 0x4E80)] + list("ひらがなカタカナ한국어"),
        "scripts": list("ÀéîõüßñçŁźČΑβγδЖжЯяשלוםمرحباनमस्तेไทย") + ["e\u0301", "\u200d"],
        "emoji": ["😀", "🚀", "👍🏽", "👨‍👩‍👧", "🇯🇵", "❤️", "🤖", "✅"],
        "punct": list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~«»“”‘’—–…¿¡·"),
        "contractions": ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "'Re"],
        "specials": specials,
        "bmp": bmp,
    }


HANDPICKED = [
    "", " ", "  ", "\n", "\n\n", " \n ", "\t\t", "a", "hello world", "Hello  world",
    "a  1", "x\n\n1", "  12345", "3.14159", "1,000,000", "$1.50", "2024-01-01T12:00:00Z",
    "I'm here, you're there, they'll go; it's 'quoted' 'S", "don't DON'T",
    "<|im_start|>user\nhi<|im_end|>\n", "<|im_start|><|im_end|>", "a<|endoftext|>b",
    " <|im_end|> ", "<|im_end|", "<<|im_start|>>", "<|im_start|>system\nYou are SmolLM.",
    "日本語のテキストです。", "中文 和 English 混合", "😀😀😀", "👨‍👩‍👧 family", "🇯🇵🇫🇷",
    "naïve café résumé", "Ελληνικά κείμενο", "Привет, мир!", "مرحبا بالعالم", "नमस्ते दुनिया",
    "e\u0301", "\u00a0\u00a0x", "x\u3000y", "tab\tsep\tvalues", "trailing   ", "   leading",
    "def f(x):\n    return x ** 2\n", "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
    "#include <stdio.h>\nint main() { printf(\"%d\\n\", 42); }", "a\r\nb\r\n", "\r\n\r\n",
    "٣٤٥ ²³ Ⅻ ½", "x²+y²=z²", "ＡＢＣ１２３", "𝟙𝟚𝟛", "a" * 300, " " * 100 + "x",
    "!!!???...", "''''", "\"quoted\"", "http://example.com/path?q=1&r=2#frag",
    "user@example.com", "C:\\Windows\\System32", "snake_case_name camelCaseName",
    "ſ's 'ſ", "\u2028line\u2029para", "\x0bvt\x0cff", "\x85nel", "a\u200bb",
]


def corpus(specials=None):
    """specials: texts mixed in as the "specials" pool (default: SmolLM2's and two
    near misses)."""
    rng = random.Random(20240601)
    pools = _char_pools(specials or SPECIALS + ["<|im_start", "|im_end|>"])
    out = list(HANDPICKED)
    # Lines and multi-line chunks of real text and real code.
    texts = []
    for p in sorted(pathlib.Path("/usr/share/common-licenses").glob("*")):
        if p.is_file():
            texts.append(p.read_text(errors="ignore"))
    for p in sorted(ROOT.glob("engine/**/*.cc"))[:20] + sorted(ROOT.glob("tests/python/*.py")):
        texts.append(p.read_text(errors="ignore"))
    for text in texts:
        lines = text.splitlines(keepends=True)
        for _ in range(40):
            i = rng.randrange(len(lines)) if lines else 0
            out.append("".join(lines[i:i + rng.choice([1, 1, 2, 5, 12])]))
    # Random mixtures, weighted towards the cases that split differently.
    names = list(pools)
    for _ in range(1400):
        parts = []
        for _ in range(rng.randrange(1, 25)):
            pool = pools[rng.choice(names)]
            parts.append(rng.choice(pool) * rng.choice([1, 1, 1, 2, 3]))
        out.append("".join(parts))
    return out
