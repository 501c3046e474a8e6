#!/usr/bin/env bash
# ./dev setup on a machine that lacks some Debian packages: it must ask apt-get to install exactly the missing ones
# and exit 0; on a machine that has them all it must not call apt-get; when apt-get fails it must say so; every npm
# package folder of the repository gets `npm ci` once, and again after its lockfile changes. dpkg-query, apt-get,
# sudo and npm are shims; the real ones are never called. Usage: dev_setup_test.sh PATH/TO/dev
set -uo pipefail
DEV_SRC=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# A copy of ./dev alone in a folder: no web/ or tests/ package.json there, so only the Debian step runs.
mkdir -p "$work/repo" "$work/bin"
cp "$DEV_SRC" "$work/repo/dev"

# dpkg-query -W -f=FORMAT PKG...: prints "PKG install ok installed" for every package not listed in $MISSING_FILE
# and, like the real one, exits 1 when any named package is not installed.
cat >"$work/bin/dpkg-query" <<'SHIM'
#!/usr/bin/env bash
rc=0
for a in "$@"; do
  case "$a" in -*) continue ;; esac
  if grep -qx "$a" "$MISSING_FILE"; then
    echo "dpkg-query: no packages found matching $a" >&2
    rc=1
  else
    echo "$a install ok installed"
  fi
done
exit $rc
SHIM
cat >"$work/bin/apt-get" <<'SHIM'
#!/usr/bin/env bash
echo "$*" >>"$APT_LOG"
[ "${APT_FAIL:-0}" = 1 ] && [ "$1" = install ] && exit 100
exit 0
SHIM
printf '#!/usr/bin/env bash\nexec "$@"\n' >"$work/bin/sudo"
chmod +x "$work/bin/"*

run_setup() {  # MISSING... -> output in $work/out, exit status in $rc
  printf '%s\n' "$@" >"$work/missing"
  : >"$work/apt.log"
  PATH="$work/bin:$PATH" MISSING_FILE="$work/missing" APT_LOG="$work/apt.log" \
    bash "$work/repo/dev" setup >"$work/out" 2>&1
  rc=$?
}

# 1. Two packages missing: apt-get update, then install of exactly those two.
run_setup libtorch-dev chromium
[ "$rc" -eq 0 ] || fail "setup with missing packages exited $rc: $(cat "$work/out")"
grep -qx 'update -qq' "$work/apt.log" || fail "apt-get update was not run: $(cat "$work/apt.log")"
install_line=$(grep '^install' "$work/apt.log")
installed=$(tr ' ' '\n' <<<"$install_line" | grep -v '^-' | grep -v '^install$' | sort | tr '\n' ' ')
[ "$installed" = "chromium libtorch-dev " ] || fail "apt-get was asked to install '$installed', want 'chromium libtorch-dev '"
grep -q 'installing Debian packages: libtorch-dev chromium' "$work/out" || fail "setup did not say what it installs"

# 2. Nothing missing: apt-get is not called at all.
run_setup
[ "$rc" -eq 0 ] || fail "setup with nothing missing exited $rc"
[ ! -s "$work/apt.log" ] || fail "apt-get was called with nothing missing: $(cat "$work/apt.log")"

# 3. apt-get install fails: non-zero exit and a message that says which step failed.
APT_FAIL=1 run_setup cmake
[ "$rc" -ne 0 ] || fail "setup exited 0 although apt-get install failed"
grep -q 'installing Debian packages failed' "$work/out" || fail "no message naming the failed step: $(cat "$work/out")"

# 4. A fresh checkout: every npm package folder of the repository (each tracked package.json beside its lockfile)
#    gets `npm ci` from ./dev setup, and a second setup, with node_modules present, installs nothing. npm is a shim
#    (it writes node_modules/.package-lock.json, as npm does).
repo_root=$(cd "$(dirname "$DEV_SRC")" && pwd)
mapfile -t npm_dirs < <(git -C "$repo_root" ls-files '*package.json' | grep -v node_modules | xargs -r -n1 dirname | sort)
[ ${#npm_dirs[@]} -gt 0 ] || fail "no package.json is tracked in $repo_root"
for d in "${npm_dirs[@]}"; do
  mkdir -p "$work/repo/$d"
  cp "$repo_root/$d/package.json" "$work/repo/$d/"
done
cat >"$work/bin/npm" <<'SHIM'
#!/usr/bin/env bash
echo "$PWD $*" >>"$NPM_LOG"
mkdir -p node_modules
touch node_modules/.package-lock.json
SHIM
chmod +x "$work/bin/npm"
: >"$work/npm.log"
NPM_LOG="$work/npm.log" run_setup
[ "$rc" -eq 0 ] || fail "setup with npm folders exited $rc: $(cat "$work/out")"
for d in "${npm_dirs[@]}"; do
  grep -q "^$work/repo/$d ci " "$work/npm.log" || fail "./dev setup did not run npm ci in $d: $(cat "$work/npm.log")"
done
: >"$work/npm.log"
NPM_LOG="$work/npm.log" run_setup
[ ! -s "$work/npm.log" ] || fail "npm ran again although node_modules were present: $(cat "$work/npm.log")"

# 5. A lockfile changed after the install (a pull that pins a new package): that folder, and only it, installs again.
changed=${npm_dirs[0]}
touch -d '+1 minute' "$work/repo/$changed/package-lock.json"
: >"$work/npm.log"
NPM_LOG="$work/npm.log" run_setup
[ "$rc" -eq 0 ] || fail "setup after a lockfile change exited $rc: $(cat "$work/out")"
grep -q "^$work/repo/$changed ci " "$work/npm.log" || fail "npm ci did not run again in $changed: $(cat "$work/npm.log")"
[ "$(wc -l <"$work/npm.log")" -eq 1 ] || fail "npm ran in folders whose lockfile did not change: $(cat "$work/npm.log")"

if [ "$failures" -eq 0 ]; then echo "dev setup: 5 scenarios passed"; fi
exit $((failures > 0))
