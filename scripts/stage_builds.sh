#!/usr/bin/env bash
# Copy one stage folder as each of several git revisions holds it into builds/<name>/ (git-ignored), so that
# gpu_check.sh's part `builds` tests and times each build's kernels against the others' in one run, on one machine.
#   bash scripts/stage_builds.sh stage12_hopper_attention main some-branch 1e1933b
# REVISION+DIFF is the revision with a kept diff applied to the stage folder (its other paths left out), as a log
# folder keeps a build that did not land:
#   bash scripts/stage_builds.sh stage12_hopper_attention main main+benchmarks/logs/FOLDER/overlap-held.diff
# A build's name is its revision (and the diff's file name) with each character that is not a letter or a digit
# made "_" (a package name: its tests import their stage's modules relatively). Name `builds` in the device run's
# carry: it is ignored.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 STAGE_FOLDER REVISION [REVISION ...]"; exit 2; }
stage=$1; shift
[ -d "$stage" ] || { echo "$0: no stage folder $stage here (run it from the repository root)"; exit 2; }
rm -rf builds && mkdir builds
for spec in "$@"; do
  rev=${spec%%+*}; diff=; [ "$spec" = "$rev" ] || diff=${spec#*+}
  git rev-parse --verify -q "$rev^{commit}" >/dev/null || { echo "$0: no revision $rev"; rm -rf builds; exit 2; }
  [ -z "$diff" ] || [ -f "$diff" ] || { echo "$0: no diff file $diff"; rm -rf builds; exit 2; }
  name=b_$(printf '%s' "$rev${diff:+_$(basename "$diff" .diff)}" | tr -c 'A-Za-z0-9' '_')
  tmp=$(mktemp -d)
  git archive "$rev" "$stage" | tar -x -C "$tmp"
  if [ -n "$diff" ]; then
    if ! (cd "$tmp" && git apply --include="$stage/*" "$OLDPWD/$diff"); then
      echo "$0: $diff does not apply to $stage at $rev"; rm -rf builds "$tmp"; exit 2
    fi
  fi
  mv "$tmp/$stage" "builds/$name" && rm -rf "$tmp"
  echo "builds/$name: $stage at $(git rev-parse --short "$rev") ($rev)${diff:+ with $diff}"
done
