#!/usr/bin/env python3
"""The checks behind deploy/check.sh (which installs the tools and renders the manifests first).

1. Every `tela ...` command line in deploy/ is checked against the real binary: the manifests'
   container command/args, exec probes and lifecycle hooks; the systemd units' Exec* lines;
   commands in the README's code blocks, in `backticks` and in indented comment lines of the
   unit, manifest, script and container definition files (`apptainer exec tela.sif tela ...`
   and `apptainer run tela.sif ...` count as tela command lines). Every subcommand and flag
   must appear in `tela <role> --help`, a flag that takes a value must get one, and the
   binary itself must accept the line (it is run with `--help` appended, so clap parses every
   flag and typed value without starting anything). TELA_* variables (container env,
   Environment=, the env-file examples) must be ones `tela <role> --help` lists, and
   --hardware-profile values ones `tela hardware` knows.
2. Invariants of the deployment: the node's drain (preStop / ExecStop runs `tela drain` on the
   node's own control socket; terminationGracePeriodSeconds / TimeoutStopSec above the drain
   window), probes present and pointing at the node's control socket, restart policy and
   exit status 78, non-root security contexts and systemd hardening.
3. A smoke run on loopback: the gateway and node started with the command lines of the
   Kubernetes manifests and of the systemd units (addresses, paths and secrets swapped for
   local ones), the probes and hooks run for real against them, a chat completion sent
   through the gateway, and the drain (preStop / ExecStop) checked to make the node exit 0.
"""

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import yaml

FAILURES = []


def fail(where, msg):
    FAILURES.append(f"{where}: {msg}")
    print(f"  FAIL {where}: {msg}", flush=True)


def ok(where, msg):
    print(f"  ok   {where}: {msg}", flush=True)


def clean_env(extra=None):
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root")}
    env.update(extra or {})
    return env


# ---------------------------------------------------------------------------------------------
# What the binary says it accepts


class Help:
    """`tela [path...] --help`, parsed: options (and whether each takes a value), TELA_*
    variables, subcommands, whether positionals are accepted."""

    OPTION = re.compile(r"^ {2,6}(?:-([A-Za-z0-9]), )?--([A-Za-z0-9][A-Za-z0-9-]*)(?: <([^>]+)>)?")
    SHORT_ONLY = re.compile(r"^ {2,6}-([A-Za-z0-9])(?: <([^>]+)>)?\s")

    def __init__(self, tela, path):
        self.path = path
        run = subprocess.run([tela, *path, "--help"], capture_output=True, text=True, env=clean_env(), timeout=30)
        if run.returncode != 0:
            raise KeyError(" ".join(path))
        self.text = run.stdout
        self.long = {}
        self.short = {}
        self.envs = set(re.findall(r"\[env: ([A-Z0-9_]+)", self.text))
        self.commands = set()
        self.positionals = False
        section = None
        for line in self.text.splitlines():
            if re.match(r"^[A-Z][A-Za-z ]*:$", line):
                section = line[:-1]
                continue
            if line.startswith("Usage:") or (section == "Usage" and line.startswith("       ")):
                words = re.findall(r"[<\[][^>\]]+[>\]]", line)
                if any(w not in ("[OPTIONS]", "<COMMAND>") for w in words):
                    self.positionals = True
                section = "Usage"
                continue
            if section == "Commands":
                m = re.match(r"^  ([a-z][a-z0-9-]*)(\s|$)", line)
                if m and m.group(1) != "help":
                    self.commands.add(m.group(1))
                continue
            m = self.OPTION.match(line)
            if m:
                takes = m.group(3) is not None
                self.long[m.group(2)] = takes
                if m.group(1):
                    self.short[m.group(1)] = takes
                continue
            m = self.SHORT_ONLY.match(line)
            if m:
                self.short[m.group(1)] = m.group(2) is not None


class Tela:
    def __init__(self, binary):
        self.binary = binary
        self.helps = {}
        self.profiles = {}

    def help(self, path):
        path = tuple(path)
        if path not in self.helps:
            try:
                self.helps[path] = Help(self.binary, path)
            except KeyError:
                self.helps[path] = None
        return self.helps[path]

    def profile_ok(self, profile):
        if profile not in self.profiles:
            run = subprocess.run(
                [self.binary, "hardware", "--hardware-profile", profile],
                capture_output=True, text=True, env=clean_env(), timeout=30,
            )
            self.profiles[profile] = run.returncode == 0
        return self.profiles[profile]


def is_tela(word):
    return os.path.basename(word) == "tela"


def analyse(tela, argv):
    """Checks one `tela ...` argv against the help texts. Returns (role path, {flag: value},
    [problems])."""
    problems = []
    path = []
    helps = tela.help(())
    opts = {}
    i = 1
    while i < len(argv):
        word = argv[i]
        if word.startswith("--") and len(word) > 2:
            name, eq, value = word[2:].partition("=")
            takes = helps.long.get(name)
            if takes is None:
                problems.append(f"`tela {' '.join(path)} --help` has no flag --{name}")
            elif takes and not eq:
                if i + 1 >= len(argv):
                    problems.append(f"--{name} needs a value")
                else:
                    value = argv[i + 1]
                    i += 1
            elif not takes and eq:
                problems.append(f"--{name} takes no value (given '{value}')")
            opts.setdefault(name, value if takes else True)
        elif word.startswith("-") and len(word) > 1 and word != "-":
            for ch in word[1:]:
                if ch not in helps.short:
                    problems.append(f"`tela {' '.join(path)} --help` has no flag -{ch}")
        elif word in helps.commands:
            path.append(word)
            helps = tela.help(path)
            if helps is None:
                problems.append(f"`tela {' '.join(path)} --help` failed")
                return path, opts, problems
        elif not helps.positionals:
            problems.append(
                f"unexpected argument '{word}' (`tela {' '.join(path)}` takes no positional argument"
                + (f"; subcommands: {', '.join(sorted(helps.commands))}" if helps.commands else "")
                + ")"
            )
        i += 1
    if not path and not ({"help", "version"} & set(opts)) and not set(argv[1:]) & {"-h", "-V"}:
        problems.append("no subcommand")
    if not problems:
        # The binary's own parser: every flag and typed value, nothing started (--help wins).
        run = subprocess.run([tela.binary, *argv[1:], "--help"], capture_output=True, text=True,
                             env=clean_env(), timeout=30)
        if run.returncode != 0:
            err = (run.stderr.strip().splitlines() or ["?"])[0]
            problems.append(f"the binary refuses it: {err}")
    profile = opts.get("hardware-profile")
    # An ALL-CAPS value is a placeholder in prose (`--hardware-profile NAME`).
    if isinstance(profile, str) and not re.fullmatch(r"[A-Z][A-Z0-9_]*", profile) and not tela.profile_ok(profile):
        problems.append(f"--hardware-profile {profile}: `tela hardware` knows no such profile")
    return path, opts, problems


COMMANDS_CHECKED = []


def check_argv(tela, where, argv):
    path, opts, problems = analyse(tela, argv)
    shown = " ".join(shlex.quote(a) for a in ["tela", *argv[1:]])
    COMMANDS_CHECKED.append((where, shown))
    if problems:
        for p in problems:
            fail(where, f"{shown}: {p}")
    else:
        ok(where, shown)
    return path, opts


def check_env_names(tela, where, role, names):
    helps = tela.help(role)
    if helps is None:
        return
    for name in names:
        if not name.startswith("TELA_"):
            continue
        if name in helps.envs:
            ok(where, f"{name} is read by `tela {' '.join(role)}`")
        else:
            fail(where, f"{name} is not a variable of `tela {' '.join(role)}` (see its --help)")


def parse_duration(text):
    """Seconds in a duration like 15m, 90s, 16min, 1h30m, 60s (humantime / systemd style)."""
    units = {"ms": 0.001, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hr": 3600}
    total = 0.0
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", text.strip())
    if not parts or "".join(n + u for n, u in parts) != re.sub(r"\s+", "", text.strip()):
        raise ValueError(f"cannot read duration '{text}'")
    for number, unit in parts:
        if unit not in units and unit != "":
            raise ValueError(f"unknown unit in '{text}'")
        total += float(number) * units.get(unit, 1)
    return total


# ---------------------------------------------------------------------------------------------
# Shell command lines (README code blocks, comments)

SEPARATORS = {"&&", "||", "|", ";", "&", "(", ")", "$(", ";;", "--"}  # `kubectl exec ... -- tela`
REDIRECTS = {">", ">>", "<", "<<", "<<<", ">&", "&>", "2>", "2>>", "|&"}
WRAPPERS = {"sudo", "exec", "env", "nohup", "time", "command", "srun"}
CONTAINER_RUNNERS = {"apptainer", "singularity"}


def container_image(tokens, i):
    """`apptainer exec|run [options] IMAGE.sif ...` at tokens[i]: the index of the image, or None."""
    if tokens[i] not in CONTAINER_RUNNERS or i + 1 >= len(tokens) or tokens[i + 1] not in ("exec", "run"):
        return None
    return next((j for j in range(i + 2, len(tokens)) if tokens[j].endswith(".sif")), None)


def shell_commands(line):
    """The `tela ...` argvs in one shell line: tela must be in command position."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        tokens = list(lexer)
    except ValueError:
        return []
    found = []
    start = True
    current = None
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok in SEPARATORS or (set(tok) <= set("&|;()") and tok):
            if current:
                found.append(current)
            current, start = None, True
        elif tok in REDIRECTS or (set(tok) <= set("<>&") and tok):
            if current:
                found.append(current)
                current = None
            i += 1  # the redirection's target
            start = False
        elif current is not None:
            if re.fullmatch(r"\d", tok) and i + 1 < len(tokens) and tokens[i + 1].startswith(">"):
                pass  # 2>/dev/null
            else:
                current.append(tok)
        elif start:
            if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", tok) or tok in WRAPPERS:
                pass
            elif tok.startswith("-") and i > 0 and tokens[i - 1] in WRAPPERS:
                pass
            elif is_tela(tok):
                current = [tok]
            elif (image := container_image(tokens, i)) is not None:
                # `apptainer exec tela.sif tela node ...` runs tela; so does `apptainer run
                # tela.sif node ...` (the image's runscript is tela).
                if tokens[i + 1] == "run" and os.path.basename(tokens[image]).startswith("tela"):
                    current = ["tela"]
                i = image
            else:
                start = False
        i += 1
    if current:
        found.append(current)
    return found


def logical_lines(lines):
    """Joins backslash continuations; yields (first line number, text)."""
    buf, first = "", None
    for n, line in lines:
        if first is None:
            first = n
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        yield first, buf + line
        buf, first = "", None
    if buf:
        yield first, buf


INLINE = re.compile(r"`(tela(?: [^`]*)?)`")


def check_inline(tela, where, text):
    for span in INLINE.findall(text):
        for argv in shell_commands(span):
            if len(argv) > 1:
                check_argv(tela, where, argv)


def check_markdown(tela, path, rel):
    lines = open(path, encoding="utf-8").read().splitlines()
    in_code, lang, block = False, "", []
    paragraph = []  # (first line, text): inline `tela ...` spans may wrap across lines

    def flush():
        if paragraph:
            check_inline(tela, f"{rel}:{paragraph[0][0]}", " ".join(t for _, t in paragraph))
            paragraph.clear()

    for n, line in enumerate(lines, 1):
        fence = re.match(r"^\s*```(\w*)", line)
        if fence:
            flush()
            if not in_code:
                in_code, lang, block = True, fence.group(1), []
            else:
                if lang in ("", "sh", "bash", "shell", "console"):
                    for first, text in logical_lines(block):
                        text = re.sub(r"^\s*\$ ", "", text)
                        for argv in shell_commands(text):
                            check_argv(tela, f"{rel}:{first}", argv)
                in_code = False
            continue
        if in_code:
            block.append((n, line))
        elif line.strip():
            paragraph.append((n, line.strip()))
        else:
            flush()
    flush()


def check_comments(tela, path, rel):
    """Comment lines of unit / YAML / env files: backticked spans, and indented command
    examples (`#   tela ...`)."""
    numbered = []
    for n, line in enumerate(open(path, encoding="utf-8").read().splitlines(), 1):
        m = re.match(r"^\s*#(.*)$", line)
        if not m:
            continue
        body = m.group(1)
        check_inline(tela, f"{rel}:{n}", body)
        if body.startswith("   "):
            numbered.append((n, body))
    for first, text in logical_lines(numbered):
        for argv in shell_commands(text):
            check_argv(tela, f"{rel}:{first}", argv)


# ---------------------------------------------------------------------------------------------
# Kubernetes


def pod_specs(doc):
    kind = doc.get("kind")
    spec = doc.get("spec") or {}
    if kind in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"):
        return [spec.get("template", {}).get("spec", {})]
    if kind == "CronJob":
        return [spec.get("jobTemplate", {}).get("spec", {}).get("template", {}).get("spec", {})]
    if kind == "Pod":
        return [spec]
    return []


def container_commands(c):
    """(field, argv) for the container's own command and every exec probe / hook."""
    out = []
    main = list(c.get("command") or []) + list(c.get("args") or [])
    if main:
        out.append(("command", main))
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        cmd = ((c.get(probe) or {}).get("exec") or {}).get("command")
        if cmd:
            out.append((probe, list(cmd)))
    for hook in ("postStart", "preStop"):
        cmd = (((c.get("lifecycle") or {}).get(hook) or {}).get("exec") or {}).get("command")
        if cmd:
            out.append((f"lifecycle.{hook}", list(cmd)))
    return out


def check_security(where, pod, c):
    before = len(FAILURES)
    psc = pod.get("securityContext") or {}
    sc = c.get("securityContext") or {}
    if not (sc.get("runAsNonRoot", psc.get("runAsNonRoot")) is True):
        fail(where, "runAsNonRoot is not true")
    if sc.get("runAsUser", psc.get("runAsUser")) == 0:
        fail(where, "runs as uid 0")
    if sc.get("allowPrivilegeEscalation") is not False:
        fail(where, "allowPrivilegeEscalation is not false")
    if "ALL" not in ((sc.get("capabilities") or {}).get("drop") or []):
        fail(where, "capabilities.drop lacks ALL")
    if (sc.get("capabilities") or {}).get("add"):
        fail(where, "adds capabilities")
    if sc.get("privileged"):
        fail(where, "privileged")
    seccomp = (sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
    if seccomp not in ("RuntimeDefault", "Localhost"):
        fail(where, f"seccompProfile is {seccomp!r}, not RuntimeDefault")
    if sc.get("readOnlyRootFilesystem") is not True:
        fail(where, "readOnlyRootFilesystem is not true")
    if len(FAILURES) == before:
        ok(where, "non-root, no privilege escalation, ALL capabilities dropped, seccomp RuntimeDefault, read-only root")


def check_manifests(tela, files):
    """Returns the first gateway and node pod specs found (for the smoke run)."""
    found = {}
    for f in files:
        rel = os.path.basename(f)
        for doc in yaml.safe_load_all(open(f, encoding="utf-8")):
            if not doc:
                continue
            name = f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
            for pod in pod_specs(doc):
                if pod.get("hostNetwork") or pod.get("hostPID") or pod.get("hostIPC"):
                    fail(f"{rel}:{name}", "uses the host's network, PID or IPC namespace")
                for v in pod.get("volumes") or []:
                    if "hostPath" in v:
                        fail(f"{rel}:{name}", f"volume {v.get('name')} is a hostPath")
                grace = pod.get("terminationGracePeriodSeconds", 30)
                for c in (pod.get("initContainers") or []) + (pod.get("containers") or []):
                    where = f"{rel}:{name}:{c.get('name')}"
                    check_security(where, pod, c)
                    role = None
                    commands = container_commands(c)
                    for field, argv in commands:
                        if argv and is_tela(argv[0]):
                            path, opts = check_argv(tela, f"{where}.{field}", argv)
                            if field == "command":
                                role, main_opts = path, opts
                    if role is None:
                        continue
                    check_env_names(tela, f"{where}.env", role, [e.get("name", "") for e in c.get("env") or []])
                    found.setdefault(tuple(role), (f"{rel}:{name}", pod, c))
                    if role == ["node"]:
                        check_k8s_node(tela, where, pod, c, main_opts, grace)
                    elif role == ["gateway"]:
                        check_k8s_gateway(where, pod, c, main_opts, grace)
    return found


def env_value(c, name):
    for e in c.get("env") or []:
        if e.get("name") == name and "value" in e:
            return e["value"]
    return None


def check_k8s_node(tela, where, pod, c, opts, grace):
    window_text = opts.get("drain-window") or env_value(c, "TELA_DRAIN_WINDOW") or "15m"
    window = parse_duration(window_text)
    if grace > window:
        ok(where, f"terminationGracePeriodSeconds {grace} > drain window {window_text} ({window:.0f} s)")
    else:
        fail(where, f"terminationGracePeriodSeconds {grace} does not exceed the drain window {window_text}")
    control = opts.get("control")
    commands = dict(container_commands(c))
    pre = commands.get("lifecycle.preStop")
    if not pre or not is_tela(pre[0]) or pre[1:2] != ["drain"]:
        fail(where, "preStop does not run `tela drain`")
    elif analyse(tela, pre)[1].get("control") != control:
        fail(where, f"preStop drains --control {analyse(tela, pre)[1].get('control')}, the node listens on {control}")
    else:
        ok(where, f"preStop runs `tela drain` on the node's control socket {control}")
    for probe in ("readinessProbe", "livenessProbe"):
        argv = commands.get(probe)
        if not c.get(probe):
            fail(where, f"no {probe}")
        elif argv and is_tela(argv[0]) and analyse(tela, argv)[1].get("control") != control:
            fail(where, f"{probe} asks --control {analyse(tela, argv)[1].get('control')}, the node listens on {control}")
        else:
            ok(where, f"{probe} present")


def check_k8s_gateway(where, pod, c, opts, grace):
    shutdown = parse_duration(opts.get("shutdown-grace") or "30s")
    sleep = ((((c.get("lifecycle") or {}).get("preStop") or {}).get("sleep")) or {}).get("seconds", 0)
    if grace >= shutdown + sleep:
        ok(where, f"terminationGracePeriodSeconds {grace} >= preStop sleep {sleep} s + --shutdown-grace {shutdown:.0f} s")
    else:
        fail(where, f"terminationGracePeriodSeconds {grace} < preStop sleep {sleep} s + --shutdown-grace {shutdown:.0f} s")
    listen_port = int(str(opts.get("listen") or "127.0.0.1:8080").rsplit(":", 1)[1])
    ports = {p.get("name"): p.get("containerPort") for p in c.get("ports") or []}
    for probe in ("readinessProbe", "livenessProbe"):
        get = (c.get(probe) or {}).get("httpGet")
        if not c.get(probe):
            fail(where, f"no {probe}")
        elif get:
            port = ports.get(get.get("port"), get.get("port"))
            if port != listen_port:
                fail(where, f"{probe} dials port {port}, the API listens on {listen_port}")
            else:
                ok(where, f"{probe} GET {get.get('path')} on the API port {port}")


# ---------------------------------------------------------------------------------------------
# systemd


def parse_unit(path):
    entries = []  # (section, key, value, line)
    section = None
    raw = [(n, l) for n, l in enumerate(open(path, encoding="utf-8").read().splitlines(), 1)]
    raw = [(n, l) for n, l in raw if not l.lstrip().startswith(("#", ";"))]
    for n, line in logical_lines(raw):
        line = line.strip()
        if not line:
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        entries.append((section, key.strip(), value.strip(), n))
    return entries


def exec_argv(value):
    prefix = re.match(r"^[-@:+!|]*", value).group(0)
    argv = shlex.split(value[len(prefix):])
    if "@" in prefix and len(argv) > 1:
        argv = [argv[0]] + argv[2:]
    return prefix, argv


def read_env_file(path):
    env = {}
    for line in open(path, encoding="utf-8").read().splitlines():
        m = re.match(r"^\s*([A-Za-z_][A-Za-z0-9_]*)=(.*)$", line)
        if m:
            value = m.group(2).strip()
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
                value = value[1:-1]
            env[m.group(1)] = value
    return env


def check_unit(tela, path, rel, deploy):
    entries = parse_unit(path)
    get = lambda key: [v for s, k, v, _ in entries if k == key]
    role, main = None, None
    for section, key, value, n in entries:
        if key.startswith("Exec"):
            prefix, argv = exec_argv(value)
            if argv and is_tela(argv[0]):
                p, opts = check_argv(tela, f"{rel}:{n} {key}", argv)
                if key == "ExecStart":
                    role, main = p, (argv, opts)
    if role is None:
        fail(rel, "ExecStart does not run tela")
        return None
    names = [word.split("=")[0] for v in get("Environment") for word in shlex.split(v)]
    check_env_names(tela, f"{rel} Environment=", role, names)
    for hard, want in (("NoNewPrivileges", "yes"), ("ProtectSystem", "strict"), ("PrivateTmp", "yes")):
        if want not in get(hard):
            fail(rel, f"{hard}={want} missing")
    if not get("ProtectHome"):
        fail(rel, "ProtectHome= missing")
    if "on-failure" not in get("Restart"):
        fail(rel, "Restart=on-failure missing")
    else:
        ok(rel, "Restart=on-failure; NoNewPrivileges, ProtectSystem=strict, ProtectHome, PrivateTmp checked")
    stop = parse_duration((get("TimeoutStopSec") or get("TimeoutSec") or ["90s"])[-1])
    argv, opts = main
    if role == ["node"]:
        window_text = opts.get("drain-window") or "15m"
        window = parse_duration(window_text)
        if stop > window:
            ok(rel, f"TimeoutStopSec {stop:.0f} s > drain window {window_text}")
        else:
            fail(rel, f"TimeoutStopSec {stop:.0f} s does not exceed the drain window {window_text}")
        drains = [exec_argv(v)[1] for v in get("ExecStop")]
        drains = [a for a in drains if a and is_tela(a[0]) and a[1:2] == ["drain"]]
        if not drains:
            fail(rel, "ExecStop does not run `tela drain`")
        elif analyse(tela, drains[0])[1].get("control") != opts.get("control"):
            fail(rel, "ExecStop drains another control socket than ExecStart's --control")
        else:
            ok(rel, f"ExecStop runs `tela drain` on the node's control socket {opts.get('control')}")
        if "78" not in " ".join(get("RestartPreventExitStatus")).split():
            fail(rel, "RestartPreventExitStatus=78 missing (78: refused for good)")
        else:
            ok(rel, "RestartPreventExitStatus=78 (refused for good: no restart loop)")
        if "mixed" not in get("KillMode"):
            fail(rel, "KillMode=mixed missing: SIGTERM would reach the engine and cut in-flight streams")
        else:
            ok(rel, "KillMode=mixed: SIGTERM reaches the node only, the engine serves until the node stops it")
    elif role == ["gateway"]:
        grace = parse_duration(opts.get("shutdown-grace") or "30s")
        if stop > grace:
            ok(rel, f"TimeoutStopSec {stop:.0f} s > --shutdown-grace {grace:.0f} s")
        else:
            fail(rel, f"TimeoutStopSec {stop:.0f} s does not exceed --shutdown-grace {grace:.0f} s")
    return role, entries


# ---------------------------------------------------------------------------------------------
# Smoke run on loopback


class Procs:
    def __init__(self):
        self.procs = []

    def start(self, argv, env, log):
        p = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=open(log, "w"), text=True,
                             start_new_session=True)
        self.procs.append(p)
        return p

    def stop_all(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()


def first_lines(proc, count, timeout=60):
    lines = []
    deadline = time.time() + timeout
    while len(lines) < count and time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line.strip())
    return lines


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def http(url, body=None, key=None, timeout=10):
    headers = {"content-type": "application/json"}
    if key:
        headers["authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url, data=json.dumps(body).encode() if body else None, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError as e:
        return None, str(e)


def replace_opts(argv, replace, drop=()):
    """argv with each `--flag value` in `replace` given the new value (added if absent) and
    the flags in `drop` removed."""
    out, i, seen = [], 0, set()
    while i < len(argv):
        word = argv[i]
        name = word[2:].split("=")[0] if word.startswith("--") else None
        if name in replace or name in drop:
            if "=" not in word:
                i += 1
            if name in replace:
                out += [f"--{name}", replace[name]]
                seen.add(name)
        else:
            out.append(word)
        i += 1
    for name, value in replace.items():
        if name not in seen:
            out += [f"--{name}", value]
    return out


def make_key(exe, tmp):
    run = subprocess.run([exe, "gateway", "hash-key", "--generate"], capture_output=True, text=True,
                         env=clean_env(), timeout=30)
    key = run.stderr.strip().split()[-1]
    path = os.path.join(tmp, "keys")
    with open(path, "w") as f:
        f.write(run.stdout)
    return key, path


def wait_serving(api, key, what, timeout=60):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        status, body = http(f"{api}/health")
        if status == 200 and json.loads(body).get("serving_nodes", 0) >= 1:
            ok(what, f"GET /health reports a serving node ({body.strip()})")
            status, body = http(f"{api}/v1/chat/completions", key=key,
                                body={"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]})
            if status == 200 and json.loads(body).get("choices"):
                ok(what, "a chat completion with the API key went through the gateway and the node")
            else:
                fail(what, f"chat completion through the gateway: {status} {body[:200]}")
            return True
        last = (status, body)
        time.sleep(0.5)
    fail(what, f"no serving node within {timeout} s (last /health: {last})")
    return False


def wait_exit(proc, timeout):
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return None


def start_gateway(procs, exe, argv, env, tmp, what):
    gw = procs.start([exe, *argv[1:]], env, os.path.join(tmp, "gateway.log"))
    lines = first_lines(gw, 2)
    m1 = re.match(r"listening on (https?://\S+)", lines[0]) if lines else None
    m2 = re.match(r"anchor on (\S+)", lines[1]) if len(lines) > 1 else None
    if not (m1 and m2):
        fail(what, f"the gateway did not start: {lines} (log: {tmp}/gateway.log)")
        print(open(os.path.join(tmp, "gateway.log")).read()[-3000:])
        return None, None, None
    ok(what, f"gateway up: API {m1.group(1)}, anchor {m2.group(1)}")
    return gw, m1.group(1), m2.group(1)


def show_logs_or_clean(what, tmp):
    if any(f.startswith(what) for f in FAILURES):
        for log in ("gateway.log", "node.log", "engine.log"):
            p = os.path.join(tmp, log)
            if os.path.exists(p):
                print(f"--- {tmp}/{log} (last lines)\n" + "".join(open(p).readlines()[-15:]))
    else:
        shutil.rmtree(tmp, ignore_errors=True)


def smoke_kubernetes(tela, found):
    what = "smoke k8s"
    exe = tela.binary
    if ("gateway",) not in found or ("node",) not in found:
        fail(what, "the manifests have no tela gateway or tela node container")
        return
    _, gpod, gc = found[("gateway",)]
    _, npod, nc = found[("node",)]
    tmp = tempfile.mkdtemp(prefix="tela-deploy-k8s-")
    procs = Procs()
    try:
        secret = os.urandom(16).hex()
        key, keys = make_key(exe, tmp)
        engine = procs.start([exe, "engine-sim", "--port", "0"], clean_env(), os.path.join(tmp, "engine.log"))
        engine_url = first_lines(engine, 1)[0].split()[-1]
        gargv = list(gc["command"]) + list(gc.get("args") or [])
        gargv = replace_opts(gargv, {"listen": "127.0.0.1:0", "anchor-listen": "127.0.0.1:0",
                                     "api-keys": keys, "identity": f"{tmp}/gateway.key"})
        gw, api, anchor = start_gateway(procs, exe, gargv, clean_env({"TELA_JOIN_SECRET": secret}), tmp, what)
        if not gw:
            return
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            get = (gc.get(probe) or {}).get("httpGet")
            if get:
                status, body = http(api + get["path"])
                (ok if status == 200 else fail)(what, f"gateway {probe} GET {get['path']} -> {status}")
        control = f"{tmp}/run/node.sock"
        nargv = list(nc["command"]) + list(nc.get("args") or [])
        nargv = replace_opts(nargv, {"join": anchor, "backend-url": engine_url, "control": control,
                                     "identity": f"{tmp}/node.key"})
        node = procs.start([exe, *nargv[1:]], clean_env({"TELA_JOIN_SECRET": secret}), os.path.join(tmp, "node.log"))
        served = wait_serving(api, key, what)
        for field, argv in container_commands(nc):
            if field == "command" or not is_tela(argv[0]) or field == "lifecycle.preStop":
                continue
            argv = replace_opts(argv, {"control": control})
            run = subprocess.run([exe, *argv[1:]], capture_output=True, text=True, env=clean_env(), timeout=30)
            (ok if run.returncode == 0 else fail)(what, f"node {field} `{' '.join(argv)}` -> exit {run.returncode}")
        pre = dict(container_commands(nc)).get("lifecycle.preStop")
        if pre and served:
            argv = replace_opts(pre, {"control": control})
            run = subprocess.run([exe, *argv[1:]], capture_output=True, text=True, env=clean_env(), timeout=30)
            (ok if run.returncode == 0 else fail)(what, f"node preStop `{' '.join(argv)}` -> exit {run.returncode}: {run.stdout.strip()}")
            code = wait_exit(node, 30)
            (ok if code == 0 else fail)(what, f"after the preStop drain the node exited with status {code}")
        gw.send_signal(signal.SIGTERM)
        code = wait_exit(gw, 30)
        (ok if code == 0 else fail)(what, f"the gateway exited with status {code} on SIGTERM")
    finally:
        procs.stop_all()
        show_logs_or_clean(what, tmp)


def specifiers(argv, table):
    return [re.sub(r"%([a-zA-Z%])", lambda m: table.get(m.group(1), m.group(0)), a) for a in argv]


def smoke_systemd(tela, units, deploy):
    what = "smoke systemd"
    exe = tela.binary
    gw_unit = units.get(("gateway",))
    node_unit = units.get(("node",))
    if not gw_unit or not node_unit:
        fail(what, "no gateway or node unit")
        return
    tmp = tempfile.mkdtemp(prefix="tela-deploy-systemd-")
    procs = Procs()
    try:
        secret = os.urandom(16).hex()
        key, keys = make_key(exe, tmp)
        # The gateway: %d (credentials) and %S (state) in a temporary folder; plain HTTP on a
        # loopback port instead of TLS on :443 (the smoke run has no certificate).
        creds, state = f"{tmp}/credentials", f"{tmp}/state"
        os.makedirs(creds)
        os.makedirs(f"{state}/tela-gateway")
        with open(f"{creds}/join-secret", "w") as f:
            f.write(secret + "\n")
        entries = gw_unit[1]
        start = [exec_argv(v)[1] for s, k, v, n in entries if k == "ExecStart"][0]
        gargv = specifiers(start, {"d": creds, "S": state})
        gargv = replace_opts(gargv, {"listen": "127.0.0.1:0", "anchor-listen": "127.0.0.1:0", "api-keys": keys},
                             drop=("tls-cert", "tls-key"))
        genv = clean_env(read_env_file(os.path.join(deploy, "systemd", "gateway.env.example")))
        genv.pop("TELA_PUBLIC_ADDR", None)
        gw, api, anchor = start_gateway(procs, exe, gargv, genv, tmp, what)
        if not gw:
            return
        # The node: %h, %S, %t in the temporary folder (as StateDirectory= and
        # RuntimeDirectory= would make them); node.env.example with the gateway and an engine
        # simulator in place of the placeholders; the engine launched by the node.
        home, run_dir = f"{tmp}/home", f"{tmp}/run"
        os.makedirs(f"{home}/.config/tela")
        os.makedirs(f"{state}/tela", mode=0o700)
        os.makedirs(f"{run_dir}/tela", mode=0o700)
        with open(f"{home}/.config/tela/join-secret", "w") as f:
            f.write(secret + "\n")
        table = {"h": home, "S": state, "t": run_dir}
        entries = node_unit[1]
        start = [exec_argv(v)[1] for s, k, v, n in entries if k == "ExecStart"][0]
        stop = [exec_argv(v)[1] for s, k, v, n in entries if k == "ExecStop"][0]
        nargv, stop = specifiers(start, table), specifiers(stop, table)
        port = free_port()
        nenv = read_env_file(os.path.join(deploy, "systemd", "node.env.example"))
        for s, k, v, n in entries:
            if k == "Environment":
                nenv.update(dict(x.split("=", 1) for x in shlex.split(v)))
        nenv.update({"TELA_JOIN": anchor, "TELA_ENGINE_CMD": f"{exe} engine-sim --port {port}",
                     "TELA_BACKEND_URL": f"http://127.0.0.1:{port}", "HOME": home})
        node = procs.start([exe, *nargv[1:]], clean_env(nenv), os.path.join(tmp, "node.log"))
        if wait_serving(api, key, what):
            run = subprocess.run([exe, *stop[1:]], capture_output=True, text=True, env=clean_env({"HOME": home}), timeout=30)
            (ok if run.returncode == 0 else fail)(what, f"ExecStop `{' '.join(stop)}` -> exit {run.returncode}: {run.stdout.strip()}")
            code = wait_exit(node, 60)
            (ok if code == 0 else fail)(what, f"after ExecStop the node exited with status {code}")
            status, _ = http(f"http://127.0.0.1:{port}/v1/models", timeout=2)
            (ok if status is None else fail)(what, "the engine the node launched was stopped with it"
                                             if status is None else f"the engine still answers ({status})")
        gw.send_signal(signal.SIGTERM)
        code = wait_exit(gw, 70)
        (ok if code == 0 else fail)(what, f"the gateway exited with status {code} on SIGTERM")
    finally:
        procs.stop_all()
        show_logs_or_clean(what, tmp)


# ---------------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tela", required=True)
    ap.add_argument("--deploy", required=True, help="the deploy/ folder")
    ap.add_argument("--rendered", nargs="+", required=True, help="kustomize output files")
    ap.add_argument("--no-smoke", action="store_true")
    args = ap.parse_args()
    tela = Tela(os.path.abspath(args.tela))
    deploy = os.path.abspath(args.deploy)
    root = os.path.dirname(deploy)

    print("== tela command lines in the rendered manifests (and deployment invariants)")
    found = check_manifests(tela, args.rendered)

    print("== systemd units: tela command lines, variables, drain and hardening")
    units = {}
    for name in sorted(os.listdir(os.path.join(deploy, "systemd"))):
        path = os.path.join(deploy, "systemd", name)
        rel = os.path.relpath(path, root)
        if name.endswith(".service"):
            got = check_unit(tela, path, rel, deploy)
            if got:
                units[tuple(got[0])] = got
        elif name.endswith(".env.example"):
            role = name.split(".")[0]
            names = re.findall(r"^\s*#?\s*(TELA_[A-Z0-9_]+)=", open(path).read(), re.M)
            check_env_names(tela, rel, [role], names)
            profile = read_env_file(path).get("TELA_HARDWARE_PROFILE")
            if profile and not tela.profile_ok(profile):
                fail(rel, f"TELA_HARDWARE_PROFILE={profile}: no such profile")

    print("== commands in README.md, comments and backticks")
    for dirpath, _, files in os.walk(deploy):
        for name in sorted(files):
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            if name.endswith(".md"):
                check_markdown(tela, path, rel)
            elif name == "Containerfile" or name.endswith(
                (".yaml", ".yml", ".service", ".example", ".sh", ".sbatch", ".def")
            ):
                check_comments(tela, path, rel)

    if not args.no_smoke:
        print("== smoke run on loopback: the Kubernetes command lines, probes and preStop drain")
        smoke_kubernetes(tela, found)
        print("== smoke run on loopback: the systemd units' ExecStart / ExecStop")
        smoke_systemd(tela, units, deploy)

    print(f"== {len(COMMANDS_CHECKED)} tela command lines checked against {tela.binary}")
    if FAILURES:
        print(f"{len(FAILURES)} problem(s):")
        for f in FAILURES:
            print(f"  - {f}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
