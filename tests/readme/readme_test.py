#!/usr/bin/env python3
"""The README shows what runs: every block marked `<!-- snippet: PATH -->` equals that file
(which a ctest executes), and every block marked `<!-- help: PROGRAM -->` equals the output of
`PROGRAM --help` from the build. Usage: readme_test.py REPO_ROOT BIN_DIR [--write]
(--write replaces the help blocks by the programs' output instead of checking them)."""
import pathlib
import re
import subprocess
import sys


def blocks(text, kind):
    pattern = re.compile(r"<!-- %s: (\S+) -->\n```[a-z]*\n(.*?)```\n" % kind, re.S)
    return pattern.findall(text)


def main():
    root, bindir = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    readme = (root / "README.md").read_text()
    if sys.argv[3:] == ["--write"]:
        for prog, body in blocks(readme, "help"):
            out = subprocess.run([str(bindir / prog), "--help"], capture_output=True,
                                 text=True, timeout=30).stdout
            readme = readme.replace(f"<!-- help: {prog} -->\n```\n{body}```\n",
                                    f"<!-- help: {prog} -->\n```\n{out}```\n")
        (root / "README.md").write_text(readme)
        return 0
    failures, checked = [], 0
    for path, body in blocks(readme, "snippet"):
        checked += 1
        if (root / path).read_text() != body:
            failures.append(f"README block for {path} differs from the file")
    for prog, body in blocks(readme, "help"):
        checked += 1
        out = subprocess.run([str(bindir / prog), "--help"], capture_output=True, text=True,
                             timeout=30)
        if out.stdout != body:
            failures.append(f"README block for `{prog} --help` differs from its output")
    for f in failures:
        print("FAIL:", f)
    if checked == 0:
        print("FAIL: no marked blocks found in README.md")
        return 1
    print(f"{checked - len(failures)} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
