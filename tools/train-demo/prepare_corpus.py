#!/usr/bin/env python3
"""Extract the training corpus for the TurboSpark demo model from the Rust
documentation that ships with the toolchain (rustup component `rust-docs`).

    python3 tools/train-demo/prepare_corpus.py --out tools/train-demo/corpus
    # optional: --docs DIR   (default: $(rustc --print sysroot)/share/doc/rust/html)

Books used, in this order: The Rust Programming Language (`book/`), Rust by
Example (`rust-by-example/`), The Rust Reference (`reference/`). Pages are
taken in each book's table-of-contents order (mdBook's `toc-*.js`), English
only. Of each page only the `<main>` element is kept; navigation, scripts,
sidebars, rule anchors and the reference's railroad diagrams are dropped.
Prose becomes plain paragraphs, headings become `#` lines, inline code keeps
its backticks and code blocks become fenced blocks (```rust ... ```), so the
text reads like the Markdown the books were written in.

A page is one document. Documents are numbered in reading order over all
books; every 20th (index % 20 == 19) goes to the validation split, the rest to
the training split. Each output file is the documents joined by a line holding
only `<|endoftext|>`.

Outputs (into --out): train.txt, valid.txt, SOURCES.md, manifest.json.
Standard library only; deterministic (same input files -> byte-identical output).
"""

import argparse
import hashlib
import html
import json
import os
import re
import subprocess
import sys
import unicodedata
from html.parser import HTMLParser

BOOKS = [
    # (directory, title, upstream, licence)
    ("book", "The Rust Programming Language",
     "https://github.com/rust-lang/book", "MIT OR Apache-2.0"),
    ("rust-by-example", "Rust by Example",
     "https://github.com/rust-lang/rust-by-example", "MIT OR Apache-2.0"),
    ("reference", "The Rust Reference",
     "https://github.com/rust-lang/reference", "MIT OR Apache-2.0"),
]

# Pages that are tooling output, not prose.
SKIP_PAGES = {
    ("reference", "test-summary.html"),
}

DOC_SEP = "\n<|endoftext|>\n"
VALID_EVERY = 20

# Elements dropped together with everything inside them.
SKIP_TAGS = {"script", "style", "svg", "button", "nav", "iframe", "noscript",
             "template", "form", "input", "select", "textarea", "object"}
SKIP_CLASSES = {"rule", "rule-link", "grammar-railroad", "railroad",
                "uncovered-rules-popup", "popup-container", "hidden",
                "grammar-toggle-railroad", "sidebar", "nav-wrapper",
                "nav-wide-wrapper", "mdbook-help-container", "buttons",
                "fa", "fa-copy", "clip-button", "result"}
BLOCK_TAGS = {"p", "div", "blockquote", "section", "article", "header",
              "footer", "aside", "figure", "figcaption", "dl", "dd", "dt",
              "table", "thead", "tbody", "tfoot", "ul", "ol", "details",
              "summary", "hr", "main"}
VOID_TAGS = {"br", "hr", "img", "input", "meta", "link", "wbr", "col",
             "area", "base", "embed", "param", "source", "track"}


class MainText(HTMLParser):
    """Renders the inside of an mdBook page's <main> as Markdown-like text."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.out = []            # list of strings
        self.skip_depth = 0      # >0 while inside a skipped element
        self.stack = []          # open tags (name, skipped?)
        self.pre_depth = 0
        self.list_stack = []     # ["ul"|"ol", counter]
        self.in_main = False
        self.main_done = False
        self.cell_index = 0

    # -- helpers -----------------------------------------------------------
    def emit(self, s):
        if self.in_main and not self.main_done and self.skip_depth == 0:
            self.out.append(s)

    def block(self):
        self.emit("\n\n")

    # -- parser callbacks --------------------------------------------------
    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "main":
            if not self.main_done:
                self.in_main = True
            return
        if not self.in_main or self.main_done:
            return
        classes = set((a.get("class") or "").split())
        skipped = self.skip_depth > 0 or tag in SKIP_TAGS or bool(classes & SKIP_CLASSES)
        if tag in VOID_TAGS:
            if not skipped:
                if tag == "br":
                    self.emit("\n")
                elif tag == "hr":
                    self.block()
            return
        self.stack.append((tag, skipped))
        if skipped:
            self.skip_depth += 1
            return
        if tag in ("h1", "h2", "h3", "h4", "h5", "h6"):
            self.block()
            self.emit("#" * int(tag[1]) + " ")
        elif tag == "pre":
            self.block()
            self.emit("\x00PRE_OPEN\x00")
            self.pre_depth += 1
        elif tag == "code":
            if self.pre_depth:
                lang = ""
                for c in classes:
                    if c.startswith("language-"):
                        lang = c[len("language-"):]
                self.emit("```" + lang + "\n")
            else:
                self.emit("`")
        elif tag in ("ul", "ol"):
            self.block()
            self.list_stack.append([tag, 0])
        elif tag == "li":
            if self.list_stack:
                self.list_stack[-1][1] += 1
                kind, n = self.list_stack[-1]
                indent = "  " * (len(self.list_stack) - 1)
                self.emit("\n" + indent + ("- " if kind == "ul" else f"{n}. "))
            else:
                self.emit("\n- ")
        elif tag == "tr":
            self.emit("\n")
            self.cell_index = 0
        elif tag == "sub":
            self.emit(" ")
        elif tag in ("td", "th"):
            if self.cell_index:
                self.emit(" | ")
            self.cell_index += 1
        elif tag in BLOCK_TAGS:
            self.block()

    def handle_endtag(self, tag):
        if tag == "main":
            if self.in_main:
                self.in_main = False
                self.main_done = True
            return
        if not self.in_main or self.main_done or tag in VOID_TAGS:
            return
        # pop to the matching open tag (tolerates sloppy HTML)
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i][0] == tag:
                break
        else:
            return
        while len(self.stack) > i:
            name, skipped = self.stack.pop()
            if skipped:
                self.skip_depth -= 1
                continue
            self._close(name)

    def _close(self, tag):
        if tag in ("h1", "h2", "h3", "h4", "h5", "h6"):
            self.block()
        elif tag == "pre":
            self.pre_depth -= 1
            self.emit("\x00PRE_CLOSE\x00")
            self.block()
        elif tag == "code":
            if self.pre_depth:
                self.emit("\x00CODE_END\x00")
            else:
                self.emit("`")
        elif tag in ("ul", "ol"):
            if self.list_stack:
                self.list_stack.pop()
            self.block()
        elif tag in BLOCK_TAGS:
            self.block()

    def handle_data(self, data):
        if self.pre_depth:
            self.emit(data.replace("\x00", ""))
        else:
            self.emit(re.sub(r"\s+", " ", data.replace("\x00", "")))

    def handle_comment(self, data):
        pass


def normalise(raw):
    """Whitespace normalisation outside code blocks; code kept verbatim."""
    raw = unicodedata.normalize("NFC", raw)
    raw = raw.replace("\u00a0", " ").replace("\u200b", "").replace("\r", "")
    parts = re.split(r"\x00PRE_OPEN\x00|\x00PRE_CLOSE\x00", raw)
    out = []
    for i, part in enumerate(parts):
        if i % 2 == 1:  # inside <pre>
            part = part.replace("\x00CODE_END\x00", "")
            if not part.startswith("```"):
                part = "```\n" + part
            head, _, body = part.partition("\n")
            body = "\n".join(line.rstrip() for line in body.rstrip().split("\n"))
            body = body.strip("\n")
            out.append("\n\n" + head + "\n" + body + "\n```\n\n")
        else:
            part = part.replace("\x00CODE_END\x00", "")
            lines = [re.sub(r"[ \t]+", " ", l).strip() for l in part.split("\n")]
            # keep list indentation: re-derive from "- " markers is lossy, accept flat lists
            out.append("\n".join(lines))
    text = "".join(out)
    text = re.sub(r"\n{3,}", "\n\n", text)
    # empty inline code from stripped anchors: "``" -> ""
    text = text.replace(" `` ", " ")
    return text.strip() + "\n"


def toc_pages(book_dir):
    tocs = sorted(f for f in os.listdir(book_dir) if re.fullmatch(r"toc(-[0-9a-f]+)?\.js", f))
    if not tocs:
        raise SystemExit(f"{book_dir}: no toc-*.js (is this an mdBook build?)")
    js = open(os.path.join(book_dir, tocs[0]), encoding="utf-8").read()
    pages, seen = [], set()
    for href in re.findall(r'<a href="([^"#]+)(?:#[^"]*)?"', js):
        href = html.unescape(href)
        if href.startswith(("http:", "https:", "../")) or not href.endswith(".html"):
            continue
        if href in seen:
            continue
        seen.add(href)
        if os.path.isfile(os.path.join(book_dir, href)):
            pages.append(href)
    return pages


def extract(path):
    p = MainText()
    p.feed(open(path, encoding="utf-8").read())
    p.close()
    return normalise("".join(p.out))


def default_docs():
    try:
        sysroot = subprocess.run(["rustc", "--print", "sysroot"], capture_output=True,
                                 text=True, check=True).stdout.strip()
    except Exception as e:  # noqa: BLE001
        raise SystemExit(f"cannot run `rustc --print sysroot` ({e}); pass --docs DIR")
    return os.path.join(sysroot, "share", "doc", "rust", "html")


def rust_version(docs):
    try:
        return subprocess.run(["rustc", "--version"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except Exception:  # noqa: BLE001
        return "unknown"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", help="rust-docs html dir (default: from rustc --print sysroot)")
    ap.add_argument("--out", required=True, help="output directory")
    args = ap.parse_args()
    docs = args.docs or default_docs()
    os.makedirs(args.out, exist_ok=True)

    docs_list = []  # (book, page, text)
    for book, _, _, _ in BOOKS:
        bdir = os.path.join(docs, book)
        for page in toc_pages(bdir):
            if (book, page) in SKIP_PAGES:
                continue
            text = extract(os.path.join(bdir, page))
            if len(text.split()) < 5:  # empty section stubs
                continue
            if "<|endoftext|>" in text:
                raise SystemExit(f"{book}/{page}: contains the document separator")
            docs_list.append((book, page, text))

    train, valid = [], []
    stats = {b[0]: {"pages": 0, "train_pages": 0, "valid_pages": 0, "bytes": 0, "words": 0}
             for b in BOOKS}
    valid_pages = []
    for i, (book, page, text) in enumerate(docs_list):
        s = stats[book]
        s["pages"] += 1
        s["bytes"] += len(text.encode("utf-8"))
        s["words"] += len(text.split())
        if i % VALID_EVERY == VALID_EVERY - 1:
            valid.append(text)
            s["valid_pages"] += 1
            valid_pages.append(f"{book}/{page}")
        else:
            train.append(text)
            s["train_pages"] += 1

    def write(name, items):
        data = DOC_SEP.join(t.rstrip("\n") for t in items) + "\n"
        with open(os.path.join(args.out, name), "w", encoding="utf-8", newline="\n") as f:
            f.write(data)
        b = data.encode("utf-8")
        return {"bytes": len(b), "words": len(data.split()), "documents": len(items),
                "sha256": hashlib.sha256(b).hexdigest()}

    tr = write("train.txt", train)
    va = write("valid.txt", valid)
    version = rust_version(docs)

    manifest = {"docs": docs, "rustc": version, "books": stats, "train": tr, "valid": va,
                "valid_every": VALID_EVERY, "valid_pages": valid_pages,
                "separator": "<|endoftext|>"}
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")

    lines = [
        "# Corpus of the TurboSpark demo model",
        "",
        "Plain text extracted by `tools/train-demo/prepare_corpus.py` from the HTML",
        f"documentation shipped with the Rust toolchain (`{version}`, rustup component",
        "`rust-docs`, `share/doc/rust/html/`). Only each page's main content is kept;",
        "code blocks are fenced, inline code keeps its backticks. Documents (pages) are",
        "separated by a line `<|endoftext|>`; every 20th page in reading order is held",
        "out for validation.",
        "",
        "| Book | Source | Licence | Pages (train/valid) | Bytes | Words |",
        "|---|---|---|---|---|---|",
    ]
    for book, title, url, lic in BOOKS:
        s = stats[book]
        lines.append(f"| {title} (`{book}/`) | {url} | {lic} | {s['pages']} "
                     f"({s['train_pages']}/{s['valid_pages']}) | {s['bytes']:,} | {s['words']:,} |")
    lines += [
        "",
        f"- `train.txt`: {tr['documents']} documents, {tr['bytes']:,} bytes, {tr['words']:,} words, sha256 `{tr['sha256']}`",
        f"- `valid.txt`: {va['documents']} documents, {va['bytes']:,} bytes, {va['words']:,} words, sha256 `{va['sha256']}`",
        "",
        "## Licence",
        "",
        "All three books are dual-licensed under the MIT licence and the Apache License,",
        "Version 2.0, at the user's option (see the LICENSE-MIT and LICENSE-APACHE files",
        "of each upstream repository). Copyright: The Rust Project Developers and the",
        "respective book authors (The Rust Programming Language: Steve Klabnik, Carol",
        "Nichols, Chris Krycho and contributors). This extract is a derivative of those",
        "works and is distributed under the same terms (MIT OR Apache-2.0).",
        "",
    ]
    with open(os.path.join(args.out, "SOURCES.md"), "w") as f:
        f.write("\n".join(lines))
    print(json.dumps({"train": tr, "valid": va, "books": stats}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
