#!/usr/bin/env python3
"""Builds tests/data/graders/similarity.json: text pairs and what the reference
implementations of text_similarity's metrics give them, which tests/unit/test_graders.c
compares smelt's scores against (within 1e-9).

  fuzzy_match  rapidfuzz.fuzz.ratio(input, reference) / 100
  bleu         sacrebleu.sentence_bleu(input, [reference]).score / 100 (defaults: 13a
               tokens, exp smoothing, effective order)
  gleu         nltk.translate.gleu_score.sentence_gleu([reference.split()], input.split())
  rouge_N      rouge_score.rouge_scorer.RougeScorer(["rougeN"]).score(reference, input).fmeasure
  rouge_l      the same with "rougeL"

The pairs are hand-written edge cases (punctuation and numbers around sacrebleu's
regexes, HTML entities, dashes before newlines, Unicode letters, the characters whose
lowercase is ASCII, every kind of Unicode whitespace, empty texts) and seeded random
sentences over a small vocabulary (so n-grams repeat and clipping matters), and seeded
random strings over the characters those rules turn on.

Run by hand, not by `make test` (the output is committed):
    python3 -m pip install rapidfuzz nltk sacrebleu rouge-score
    python3 tests/parity/graders_reference.py
"""
import json
import os
import random
from importlib.metadata import version

import sacrebleu
from nltk.translate.gleu_score import sentence_gleu
from rapidfuzz import fuzz
from rouge_score import rouge_scorer

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "graders", "similarity.json")

HAND = [
    ("The cat sat on the mat.", "The cat sat on the mat."),
    ("The cat sat on the mat.", "A cat was sitting on the mat."),
    ("the the the the the the the", "The cat is on the mat."),
    ("", ""),
    ("", "Paris"),
    ("Paris", ""),
    ("Paris", "paris"),
    ("abc", "abd"),
    ("It costs $1,234.50 (about 3.5%) in 2024-01-15.", "It costs $1,234.50, about 3.5 %, on 2024-01-15."),
    ("a.b,c 3.14 1,000 x. y, 4.", "a . b , c 3.14 1,000 x . y , 4 ."),
    ("e-mail me: user@example.com / now!", "email me : user@example.com/now !"),
    ("pre-\nprocessing and\nlines", "preprocessing and lines"),
    ("Tom &amp; Jerry &quot;hi&quot; &lt;b&gt; &amp;lt;", "Tom & Jerry \"hi\" <b> &lt;"),
    ("<skipped>kept words<skipped>", "kept words"),
    ("Ünïcödé façade naïve café", "Unicode facade naive cafe"),
    ("日本語のテキスト、です。", "日本語 の テキスト 、 です 。"),
    ("Σίσυφος ΟΔΟΣ οδος", "σίσυφος οδος ΟΔΟΣ"),
    ("İstanbul KELVIN \u212a degrees", "istanbul kelvin k degrees"),
    ("tab\tnew\nline\u3000ideo\u00a0nbsp\u2028sep\u2009thin", "tab new line ideo nbsp sep thin"),
    ("trailing spaces   \u3000\n", "trailing spaces"),
    ("emoji 😀 test 👍🏽 ok", "emoji test ok 😀"),
    ("x" * 50, "x" * 49 + "y"),
    ("1 2 3 4 5 6 7 8 9 10", "1 2 3 4 5 6 7 8 9 10 11"),
    ("one two three four five", "five four three two one"),
    ("a b c d e f g", "a b c d e f g h i j k l m n o p"),
    ("quick brown fox", "the quick brown fox jumps over the lazy dog"),
    ("...,,,---!!!", "?!?"),
    ("A-B 3-4 x-y 10-", "A - B 3 - 4 x-y 10 -"),
    ("word", "word"),
    ("The answer is 42", "42"),
    ("x.y.z 3.a a,1 1,a ,. ..5 5- -5", "x . y . z 3 . a a , 1 1 , a"),
    ("a -\n b &amp;amp; &&lt;", "a b & <"),
]

# Characters around sacrebleu's regexes and the tokenizers' edges, for random strings.
CHARS = list("ab c.,-&;<>/'\n12é日\t\u3000İ\u212aX") + ["&amp;", "&lt;", "-\n", "<skipped>"]

VOCAB = ["the", "cat", "dog", "sat", "on", "mat", "a", "ran", "fast", "slow", "red", "42", "3.5", ",", ".", "!",
         "café", "日本", "Über", "isn't", "(x)", "e-mail", "&amp;"]


def random_pairs(n, seed=1234):
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        ref = [rng.choice(VOCAB) for _ in range(rng.randint(0, 14))]
        hyp = [w if rng.random() < 0.6 else rng.choice(VOCAB) for w in ref]
        if rng.random() < 0.5:
            hyp += [rng.choice(VOCAB) for _ in range(rng.randint(0, 4))]
        rng.shuffle(hyp) if rng.random() < 0.2 else None
        pairs.append((" ".join(hyp), " ".join(ref)))
    return pairs


def random_strings(n, seed=99):
    rng = random.Random(seed)
    return [("".join(rng.choice(CHARS) for _ in range(rng.randint(0, 30))),
             "".join(rng.choice(CHARS) for _ in range(rng.randint(0, 30)))) for _ in range(n)]


def long_pairs(seed=7):
    """Texts past 64 characters and tokens (the bit-parallel LCS spans several words)."""
    rng = random.Random(seed)
    out = []
    for n in (70, 300, 2000):
        ref = [rng.choice(VOCAB) for _ in range(n // 4)]
        hyp = [w for w in ref if rng.random() < 0.8] + [rng.choice(VOCAB) for _ in range(n // 40)]
        out.append((" ".join(hyp), " ".join(ref)))
    return out


ROUGE = ["rouge1", "rouge2", "rouge3", "rouge4", "rouge5", "rougeL"]
SCORER = rouge_scorer.RougeScorer(ROUGE)


def scores(inp, ref):
    out = {
        "fuzzy_match": fuzz.ratio(inp, ref) / 100,
        "bleu": sacrebleu.sentence_bleu(inp, [ref]).score / 100,
        "gleu": sentence_gleu([ref.split()], inp.split()),
    }
    r = SCORER.score(ref, inp)
    for name in ROUGE:
        out["rouge_l" if name == "rougeL" else "rouge_" + name[5:]] = r[name].fmeasure
    return out


def main():
    cases = [dict(input=i, reference=r, **scores(i, r)) for i, r in HAND + random_pairs(80) + random_strings(60) + long_pairs()]
    doc = {
        "made_by": "tests/parity/graders_reference.py",
        "versions": {name: version(name) for name in ("rapidfuzz", "sacrebleu", "nltk", "rouge-score")},
        "cases": cases,
    }
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {len(cases)} cases to {os.path.relpath(OUT)}")


if __name__ == "__main__":
    main()
