"""Map the files a traced run used to Debian packages and check them against
scripts/setup.sh's list (see scripts/check-packages.sh, which calls this).

usage: check_packages.py TRACE_DIR PACKAGE...

TRACE_DIR holds strace -ff output (successful open/openat/execve only).
Prints one line per package used that is neither listed, nor in the
Depends/Pre-Depends closure of a listed or an Essential package, with a
file it used; exits 1 when there is one."""
import os
import re
import subprocess
import sys

ROOTS = ("/usr/", "/lib/", "/lib64/", "/lib32/", "/bin/", "/sbin/", "/etc/")
# Files read only if present, by whatever process runs (the loader's and the
# linker's search configuration, libc's locale and message catalogs, name
# service files, fontconfig's scan of the installed fonts): their package is
# not needed, so they are not evidence.
IGNORED = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/localtime", "/etc/passwd", "/etc/group",
           "/etc/nsswitch.conf", "/etc/hosts", "/etc/resolv.conf", "/etc/host.conf", "/etc/mtab",
           "/etc/alternatives/", "/usr/share/locale/", "/usr/lib/locale/", "/usr/share/zoneinfo/",
           "/usr/lib/x86_64-linux-gnu/gconv/",
           # fontconfig (chromium) reads every font installed; the fonts a
           # page needs come with fontconfig-config's Depends.
           "/usr/share/fonts/", "/var/cache/fontconfig/")
CALL = re.compile(r'^(?:open|openat|execve)\((?:AT_FDCWD, |\d+, )?"((?:[^"\\]|\\.)*)"')


def used_paths(trace_dir):
    """Every absolute path a successful call in the traces names."""
    paths = set()
    for name in os.listdir(trace_dir):
        with open(os.path.join(trace_dir, name), errors="replace") as f:
            for line in f:
                m = CALL.match(line)
                if m and m.group(1).startswith("/"):
                    paths.add(m.group(1))
    return paths


def dpkg_owners():
    """path -> package, from dpkg's file lists (one read, not one dpkg -S a file)."""
    owners = {}
    info = "/var/lib/dpkg/info"
    for name in os.listdir(info):
        if not name.endswith(".list"):
            continue
        pkg = name[:-5].split(":")[0]
        with open(os.path.join(info, name), errors="replace") as f:
            for line in f:
                owners.setdefault(line.rstrip("\n"), pkg)
    return owners


def merged_aliases(path):
    """The path and its other spelling on a merged-/usr system (/lib <-> /usr/lib)."""
    out = [path]
    for short in ("/lib/", "/lib64/", "/lib32/", "/bin/", "/sbin/"):
        if path.startswith(short):
            out.append("/usr" + path)
        elif path.startswith("/usr" + short):
            out.append(path[4:])
    return out


def owners_of(path, owners):
    """The packages a used path shows: the path's own owner and, for a
    symlink, the owner of what it points at (a -dev package's libfoo.so and
    the runtime package's libfoo.so.N are both used)."""
    found = []
    for candidate in (path, os.path.realpath(path)):
        for alias in merged_aliases(os.path.normpath(candidate)):
            if alias in owners:
                found.append(owners[alias])
                break
    return found


def installed_packages():
    """name -> (essential, depends, pre_depends, provides) for installed packages."""
    fmt = "${Package}\t${db:Status-Status}\t${Essential}\t${Depends}\t${Pre-Depends}\t${Provides}\n"
    out = subprocess.run(["dpkg-query", "-W", "-f", fmt], check=True, capture_output=True, text=True).stdout
    pkgs = {}
    for line in out.splitlines():
        name, status, essential, dep, pre, prov = (line.split("\t") + [""] * 6)[:6]
        if status != "installed":
            continue
        pkgs[name] = (essential == "yes", dep, pre, prov)
    return pkgs


def relation_names(field):
    """[[alternative, ...], ...] of package names in a Depends-style field."""
    groups = []
    for clause in field.split(","):
        alts = []
        for alt in clause.split("|"):
            alt = re.sub(r"\(.*?\)|\[.*?\]|<.*?>", "", alt).strip()
            if alt:
                alts.append(alt.split(":")[0])
        if alts:
            groups.append(alts)
    return groups


def closure(roots, pkgs):
    """Installed packages reachable from roots through Depends and Pre-Depends
    (every installed alternative, virtual names through their providers)."""
    providers = {}
    for name, (_, _, _, prov) in pkgs.items():
        for group in relation_names(prov):
            for virtual in group:
                providers.setdefault(virtual, set()).add(name)
    seen, todo = set(), [r for r in roots if r in pkgs]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        _, dep, pre, _ = pkgs[name]
        for group in relation_names(dep) + relation_names(pre):
            for alt in group:
                for target in ({alt} if alt in pkgs else set()) | providers.get(alt, set()):
                    if target not in seen:
                        todo.append(target)
    return seen


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    trace_dir, listed = sys.argv[1], sys.argv[2:]
    pkgs = installed_packages()
    absent = [p for p in listed if p not in pkgs]
    if absent:
        print("check-packages: listed but not installed (run scripts/setup.sh first): " + " ".join(absent))
        return 2
    essential = {n for n, (e, _, _, _) in pkgs.items() if e}
    # Essential packages are on every Debian system, and so is what they
    # depend on (coreutils' cp loads libacl1 and libattr1).
    allowed = closure(listed + sorted(essential), pkgs)
    owners = dpkg_owners()

    used = {}          # package -> one file that shows it
    unowned = 0
    outside = set()    # trees outside Debian's packages (/usr/local, /opt)
    for path in sorted(used_paths(trace_dir)):
        if os.path.isdir(path):
            continue
        if path.startswith(("/usr/local/", "/opt/")):
            outside.add("/".join(path.split("/")[:4]))
            continue
        if not path.startswith(ROOTS) or path.startswith(IGNORED):
            continue
        found = owners_of(path, owners)
        if not found:
            unowned += 1
        for pkg in found:
            used.setdefault(pkg, path)

    missing = sorted(p for p in used if p not in allowed and p not in essential)
    print(f"check-packages: {len(used)} Debian packages used; {len(listed)} listed in scripts/setup.sh, "
          f"{len(essential)} Essential, {len(allowed)} with the Depends closure of both; "
          f"{unowned} used files owned by no package")
    for tree in sorted(outside):
        print(f"check-packages: also used, outside Debian's packages: {tree}")
    for pkg in missing:
        print(f"check-packages: MISSING from scripts/setup.sh: {pkg} (used: {used[pkg]})")
    if missing:
        print("check-packages: add each to the packages list in scripts/setup.sh, or stop using it")
        return 1
    print("check-packages: the package list is closed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
