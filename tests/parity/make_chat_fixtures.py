#!/usr/bin/env python3
"""Renders conversations with the real Jinja chat templates in tests/data/chat_templates/
and writes what they render to tests/data/chat_templates/expected.json.

smelt has no Jinja engine: each chat format is C (tokenizer/chat_template_build.c) that
must render exactly what the model's Jinja renders. tests/unit/test_chat_template_parity.c
renders the same conversations with chat_render and compares byte for byte, checks that
chat_template_detect names each .jinja file's format, and that the assistant mask covers
the spans listed here.

Rendering is done as transformers' apply_chat_template does it
(transformers/utils/chat_template_utils.py): an ImmutableSandboxedEnvironment with
trim_blocks and lstrip_blocks, the loopcontrols extension, its tojson filter, the
raise_exception and strftime_now globals, tools=None and documents=None, and bos_token /
eos_token from the model's tokenizer_config.json. When transformers is importable, every
text is also checked against its own render_jinja_template.

Each case holds either "text" (and "spans": the assistant mask's runs, each an assistant
turn's output through its end-of-turn token, found in the Jinja's text) or "error" (the
Jinja raised; smelt must refuse too). Cases where smelt deliberately differs from a
Jinja (documented in docs/chat-templates.md) are left out and counted in "skipped".

Regenerate with `python3 tests/parity/make_chat_fixtures.py` (needs jinja2); the output
is committed, so the tests need no Python.
"""
import json
import os
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "data", "chat_templates")

# name: (jinja file, smelt template, what detection gives for the file, extra Jinja
# variables, assistant header, end-of-turn token, bos, eos)
FORMATS = {
    "llama3.1": ("llama3.1.jinja", "llama3.1", "llama3.1", {},
                 "<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>",
                 "<|begin_of_text|>", "<|eot_id|>"),
    # Llama 3.2's Jinja asks strftime_now for the date first; smelt's date is the fixed
    # default, which the Jinja uses when given date_string.
    "llama3.2": ("llama3.2.jinja", "llama3.1", "llama3.1", {"date_string": "26 Jul 2024"},
                 "<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>",
                 "<|begin_of_text|>", "<|eot_id|>"),
    "qwen3": ("qwen3.jinja", "qwen3", "qwen3", {},
              "<|im_start|>assistant\n", "<|im_end|>", None, "<|im_end|>"),
    "qwen3-nothink": ("qwen3.jinja", "qwen3-nothink", "qwen3", {"enable_thinking": False},
                      "<|im_start|>assistant\n", "<|im_end|>", None, "<|im_end|>"),
    "gemma3": ("gemma3.jinja", "gemma", "gemma", {},
               "<start_of_turn>model\n", "<end_of_turn>", "<bos>", "<eos>"),
    "gemma2": ("gemma2.jinja", "gemma", "gemma", {},
               "<start_of_turn>model\n", "<end_of_turn>", "<bos>", "<eos>"),
    "phi3": ("phi3.jinja", "phi3", "phi3", {},
             "<|assistant|>\n", "<|end|>", "<s>", "<|endoftext|>"),
}

S, U, A = "system", "user", "assistant"

CONVERSATIONS = [
    [(U, "hi")],
    [(U, "hi"), (A, "hello")],
    [(S, "Be brief."), (U, "hi")],
    [(S, "Be brief."), (U, "hi"), (A, "hello")],
    [(S, "Be brief."), (U, "What is 2+2?"), (A, "4."), (U, "And 3+3?")],
    [(S, "Be brief."), (U, "What is 2+2?"), (A, "4."), (U, "And 3+3?"), (A, "6.")],
    [(U, "a"), (A, "b"), (U, "c"), (A, "d"), (U, "e"), (A, "f"), (U, "g")],
    [(S, "Réponds en français — brièvement."), (U, "Какой сегодня день? 今日は何曜日？ 🙂"),
     (A, "Сегодня «пятница», 金曜日 🎉")],
    [(U, ""), (A, "")],
    [(S, ""), (U, "hi"), (A, "ok")],
    [(U, "   "), (A, " \n ")],
    [(S, "  Be brief. \n"), (U, "\n\thi there  "), (A, "  hello \n\n")],
    [(S, "S\n\n"), (U, "u")],
    [(U, "\u3000x\u00a0"), (A, "\u2028y\u2003")],
    [(U, "q"), (A, "\n\nanswer")],
    [(U, "line1\nline2\n\nline3"), (A, "```python\nprint(1)\n```")],
    [(U, "a <|eot_id|> <end_of_turn> <|end|> <|im_end|> [INST]"), (A, "b")],
    [(U, "q"), (A, "<think>\nreasoning\n</think>\n\nA")],
    [(U, "q1"), (A, "<think>r1</think>a1"), (U, "q2"), (A, "<think>\nr2\n</think>\n\na2")],
    [(U, "q"), (A, "a"), (U, "<tool_response>x</tool_response>"), (A, "b")],
    [(S, "only a system prompt")],
    [(U, "a"), (U, "b")],
    [(A, "x"), (U, "y")],
    [(U, "a"), (A, "b"), (A, "c")],
    [(U, "a"), (A, "b"), (S, "late system"), (U, "c")],
    [(S, "S"), (S, "T"), (U, "u")],
    [(U, "a"), (S, "s")],
]

# (format, reason, predicate on the conversation): where smelt differs from the Jinja
# on purpose (docs/chat-templates.md).
SKIPS = [
    ("gemma2", "Gemma 2's Jinja raises on a system message; smelt folds it as Gemma 3 does",
     lambda conv: any(role == S for role, _ in conv)),
    ("gemma3", "a system message and nothing after it: the Jinja renders bos only; smelt refuses",
     lambda conv: all(role == S for role, _ in conv)),
    ("gemma3", "a system message at an odd position: the Jinja renders a 'system' turn; smelt refuses",
     lambda conv: any(role == S and i % 2 == 1 for i, (role, _) in enumerate(loop_messages(conv)))),
]


def loop_messages(conv):
    """Gemma's Jinja loops over the messages after a leading system message."""
    return conv[1:] if conv[0][0] == S else conv


def environment():
    """The environment of transformers' _compile_jinja_template (without its
    {% generation %} tracker, which these templates do not use)."""
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def transformers_render():
    try:
        from transformers.utils.chat_template_utils import render_jinja_template
    except Exception:  # noqa: BLE001 - transformers is optional: the check is extra
        return None

    def render(source, messages, gen, variables):
        texts, _ = render_jinja_template([messages], chat_template=source, add_generation_prompt=gen, **variables)
        return texts[0]
    return render


def spans(text, header, end, nothink):
    """The assistant mask's runs: after each assistant header, through the next end-of-turn
    token; qwen3-nothink's empty think block is prompt (its generation prompt holds it)."""
    out, at = [], 0
    while (start := text.find(header, at)) >= 0:
        start += len(header)
        stop = text.find(end, start)
        if stop < 0:  # the generation prompt: nothing trained
            break
        span = text[start:stop + len(end)]
        empty = "<think>\n\n</think>\n\n"
        if nothink and span.startswith(empty):
            span = span[len(empty):]
        out.append(span)
        at = stop + len(end)
    return out


def main():
    env = environment()
    check = transformers_render()
    cases, skipped, counts = [], [], {}
    formats = {}
    for name, (jinja, template, detect, extra, header, end, bos, eos) in FORMATS.items():
        with open(os.path.join(DATA, jinja), encoding="utf-8") as f:
            source = f.read()
        compiled = env.from_string(source)
        variables = dict(extra, bos_token=bos, eos_token=eos)
        formats[name] = {"jinja": jinja, "template": template, "detect": detect, "bos_token": bos, "eos_token": eos}
        for conv in CONVERSATIONS:
            reason = next((r for fmt, r, skip in SKIPS if fmt == name and skip(conv)), None)
            messages = [{"role": role, "content": content} for role, content in conv]
            for gen in (False, True):
                if reason:
                    skipped.append({"format": name, "messages": messages, "add_generation_prompt": gen,
                                    "reason": reason})
                    continue
                case = {"format": name, "messages": messages, "add_generation_prompt": gen}
                try:
                    text = compiled.render(messages=messages, tools=None, documents=None,
                                           add_generation_prompt=gen, **variables)
                    case["text"] = text
                    case["spans"] = spans(text, header, end, name == "qwen3-nothink")
                except jinja2.exceptions.TemplateError as e:
                    case["error"] = str(e)
                if check and "text" in case:
                    assert check(source, messages, gen, variables) == case["text"], (name, messages, gen)
                cases.append(case)
                counts[name] = counts.get(name, 0) + 1
    out = {
        "generated_by": "tests/parity/make_chat_fixtures.py (jinja2 %s%s)" % (
            jinja2.__version__, ", checked against transformers' render_jinja_template" if check else ""),
        "formats": formats,
        "cases": cases,
        "skipped": skipped,
    }
    with open(os.path.join(DATA, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    for name, n in counts.items():
        errors = sum(1 for c in cases if c["format"] == name and "error" in c)
        print(f"{name}: {n} cases ({errors} raise), {sum(1 for s in skipped if s['format'] == name)} skipped")


if __name__ == "__main__":
    main()
