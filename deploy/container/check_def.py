#!/usr/bin/env python3
"""Checks an Apptainer definition file without Apptainer, the way Apptainer's own parser reads it
(pkg/build/types/parser/deffile.go): a header of `Key: value` lines, then sections, each starting
at a line whose first word begins with `%`.

    check_def.py tela.def CONTEXT_DIR

Fails (exit 1) on: a header key Apptainer does not know or a Bootstrap other than scratch (this
image must pull nothing); a section name Apptainer refuses; a %files source that matches nothing
in CONTEXT_DIR (where `apptainer build` runs) or a destination that is not absolute; a runscript
whose command is not in the image, or that needs /bin/sh, which the image does not have. Then
runs the runscript with the system's sh against the image's binary, with `--version`.
"""

import glob
import os
import re
import subprocess
import sys
import tempfile

HEADERS = {"bootstrap", "from", "stage", "includecmd", "mirrorurl", "updateurl", "osversion",
           "include", "library", "registry", "namespace", "fingerprints", "confurl", "product",
           "user", "regcode", "productpgp", "setopt"}
SECTIONS = {"help", "setup", "files", "labels", "environment", "pre", "post", "runscript", "test",
            "startscript", "arguments"}
# Apptainer interprets a runscript in its built-in shell (no /bin/sh needed) when it has this line.
OCI_RUN_LINE = 'eval "set ${SINGULARITY_OCI_RUN}"'

failures = []


def fail(msg):
    failures.append(msg)
    print(f"  FAIL {msg}")


def parse(text):
    header, sections, current = [], [], None
    for line in text.splitlines():
        words = line.split()
        if words and words[0].startswith("%"):
            current = (words[0][1:].lower(), " ".join(words[1:]), [])
            sections.append(current)
        elif current is None:
            header.append(line)
        else:
            current[2].append(line)
    return header, sections


def main():
    deffile, context = sys.argv[1], sys.argv[2]
    text = open(deffile, encoding="utf-8").read()
    header, sections = parse(text)

    keys = {}
    for line in header:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.split("#")[0].partition(":")
        if not sep:
            fail(f"header line without a value: {line!r}")
            continue
        key = key.strip().lower()
        if key not in HEADERS:
            fail(f"header key {key!r} is not one Apptainer knows")
        keys[key] = value.strip()
    if keys.get("bootstrap") != "scratch":
        fail(f"Bootstrap is {keys.get('bootstrap')!r}: the image must be built from scratch (nothing to pull)")

    names = [name for name, _, _ in sections]
    for name in names:
        if name not in SECTIONS:
            fail(f"section %{name} is not one Apptainer accepts")
    for name in set(names) - {"files"}:
        if names.count(name) > 1:
            fail(f"section %{name} appears {names.count(name)} times")

    copied = 0
    for name, _, body in sections:
        if name != "files":
            continue
        for line in body:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split()
            src, dst = parts[0], parts[1] if len(parts) > 1 else parts[0]
            matches = glob.glob(os.path.join(context, src))
            if not matches:
                fail(f"%files source {src!r} matches nothing in {context}")
            if not dst.startswith("/"):
                fail(f"%files destination {dst!r} is not absolute")
            copied += len(matches)
    print(f"  ok   %files: {copied} paths from {context}")

    runscript = "\n".join(next((body for name, _, body in sections if name == "runscript"), []))
    if not runscript.strip():
        fail("no %runscript: `apptainer run` would have nothing to run")
        return
    if OCI_RUN_LINE not in runscript.splitlines():
        fail(f"the %runscript lacks the line {OCI_RUN_LINE!r} (unindented): Apptainer would run it with "
             "/bin/sh, which the image does not have")
    commands = re.findall(r"(/[\w./-]+/tela)\b", runscript)
    binary = os.path.join(context, "rootfs", commands[0].lstrip("/")) if commands else None
    if not binary or not os.access(binary, os.X_OK):
        fail(f"the %runscript runs {commands[0] if commands else 'no absolute path'}, which the image does not hold")
        return
    # What Apptainer's built-in (POSIX) shell does with it, with the image's path swapped for the
    # context's copy of the binary.
    with tempfile.NamedTemporaryFile("w", suffix=".sh") as script:
        script.write(runscript.replace(commands[0], binary))
        script.flush()
        run = subprocess.run(["sh", script.name, "--version"], capture_output=True, text=True, timeout=30)
    if run.returncode != 0 or not run.stdout.startswith("tela "):
        fail(f"the %runscript with --version did not run tela: exit {run.returncode}, {run.stdout}{run.stderr}")
    else:
        print(f"  ok   %runscript --version (in sh): {run.stdout.strip()}")


if __name__ == "__main__":
    main()
    if failures:
        sys.exit(1)
    print("  ok   the definition parses as Apptainer reads it")
