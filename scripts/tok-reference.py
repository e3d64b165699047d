#!/usr/bin/env python3
"""scripts/tok-reference.py — an independent reference for the tokenizer tests.

Builds a Hugging Face `tokenizers` tokenizer (pip install tokenizers gguf) from a GGUF's own
vocabulary, merges and special tokens, with the pre-tokenizer that tokenizer.ggml.pre names
(or --pre), and prints, for each input string (JSON lines on stdin, one JSON string each):

  ids     the token ids (special tokens parsed, no BOS/EOS added)
  pieces  the pre-tokenizer's pieces (no vocabulary needed: --pre alone, no FILE)
  chat    stdin lines are JSON {"messages": [...], "add_generation_prompt": bool}; renders the
          GGUF's tokenizer.chat_template with jinja2 (or --template-file)

Output: one JSON line per input line; with --c, C initialisers instead ({"input", "piece\x01
piece..."} for pieces, {"input", {ids...}} for ids, {"rendered"} for chat), as pasted into
the tests. Used to produce the expected values recorded in
tests/test_tok.c and tests/test_tok_model.c; it is not run by the tests.

  python3 scripts/tok-reference.py ids models/SmolLM2-135M-Instruct.Q4_1.gguf < strings.jsonl
  python3 scripts/tok-reference.py pieces --pre llama-bpe < strings.jsonl
"""
import argparse
import json
import sys
import unicodedata

GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
          r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def pre_tokenizer(pre):
    from tokenizers import Regex, pre_tokenizers as pt
    if pre == "gpt2":  # HF GPT-2: ByteLevel with its built-in regex
        return pt.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in ("smollm", "starcoder"):  # SmolLM2 / StarCoder tokenizer.json
        return pt.Sequence([pt.Digits(individual_digits=True),
                            pt.ByteLevel(add_prefix_space=False, use_regex=True)])
    if pre in ("llama-bpe", "llama3"):  # Llama 3 tokenizer.json
        return pt.Sequence([pt.Split(Regex(LLAMA3), behavior="isolated", invert=False),
                            pt.ByteLevel(add_prefix_space=False, use_regex=False)])
    sys.exit(f"tok-reference: unknown pre-tokenizer {pre!r}")


def field(reader, key):
    f = reader.fields.get(key)
    return None if f is None else f.contents()


def build(path, pre_override):
    from gguf import GGUFReader
    from tokenizers import AddedToken, Tokenizer, decoders, models
    r = GGUFReader(path)
    if field(r, "tokenizer.ggml.model") != "gpt2":
        sys.exit("tok-reference: tokenizer.ggml.model is not gpt2")
    pre = pre_override or field(r, "tokenizer.ggml.pre")
    tokens = field(r, "tokenizer.ggml.tokens")
    types = field(r, "tokenizer.ggml.token_type") or [1] * len(tokens)
    merges = [tuple(m.split(" ", 1)) for m in field(r, "tokenizer.ggml.merges")]
    vocab = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)
    bpe = models.BPE(vocab=vocab, merges=merges, ignore_merges=pre in ("llama-bpe", "llama3"))
    tk = Tokenizer(bpe)
    tk.pre_tokenizer = pre_tokenizer(pre)
    tk.decoder = decoders.ByteLevel()
    specials = [AddedToken(t, special=(ty != 4), normalized=False)
                for t, ty in zip(tokens, types) if ty in (2, 3, 4)]
    tk.add_special_tokens(specials)
    return r, tk


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["ids", "pieces", "chat"])
    ap.add_argument("file", nargs="?")
    ap.add_argument("--pre")
    ap.add_argument("--template-file")
    ap.add_argument("--bos", default="", help="bos_token for --template-file")
    ap.add_argument("--c", action="store_true", help="print C initialisers")
    a = ap.parse_args()
    if a.mode == "pieces":
        p = pre_tokenizer(a.pre or "gpt2")
        for line in sys.stdin:
            s = json.loads(line)
            # ByteLevel maps the pieces to byte-level text; map them back to real text.
            got = [piece for piece, _ in p.pre_tokenize_str(s)]
            dec = bytes_decoder()
            pieces = [dec(x) for x in got]
            if a.c:
                print("{%s, %s}," % (c_str(s), c_str("\x01".join(pieces))))
            else:
                print(json.dumps(pieces, ensure_ascii=False))
        return
    if a.mode == "chat":
        import jinja2
        if a.template_file:
            template = open(a.template_file, encoding="utf-8").read()
            bos, eos = a.bos, ""
        else:
            from gguf import GGUFReader
            r = GGUFReader(a.file)
            template = field(r, "tokenizer.chat_template")
            tokens = field(r, "tokenizer.ggml.tokens")
            bos = tokens[field(r, "tokenizer.ggml.bos_token_id")]
            eos = tokens[field(r, "tokenizer.ggml.eos_token_id")]
        env = jinja2.Environment()
        t = env.from_string(template)
        for line in sys.stdin:
            req = json.loads(line)
            out = t.render(messages=req["messages"], bos_token=bos, eos_token=eos,
                           add_generation_prompt=req["add_generation_prompt"])
            print(c_str(out) + "," if a.c else json.dumps(out, ensure_ascii=False))
        return
    _, tk = build(a.file, a.pre)
    for line in sys.stdin:
        s = json.loads(line)
        ids = tk.encode(s, add_special_tokens=False).ids
        if a.c:
            print("{%s, %d, {%s}}," % (c_str(s), len(ids), ", ".join(map(str, ids))))
        else:
            print(json.dumps(ids))


def c_str(s):
    """A C string literal of s's UTF-8 bytes: printable ASCII and non-ASCII text as is,
    controls, marks, separators and format characters escaped, so that no editor can normalise
    or hide them (a hex escape is closed with "" so that no digit follows it)."""
    out = []
    for ch in s:
        o = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif o < 0x20 or o == 0x7F or unicodedata.category(ch)[0] in "MZC" and o != 0x20:
            out.append("".join('\\x%02X""' % b for b in ch.encode("utf-8")))
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def bytes_decoder():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    inv = {chr(c): b for b, c in zip(bs, cs)}
    return lambda s: bytes(inv[c] for c in s).decode("utf-8", errors="replace")


if __name__ == "__main__":
    main()
