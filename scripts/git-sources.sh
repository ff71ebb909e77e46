# Sourced by scripts/test.sh and scripts/lab.sh (from the repository root): upstream git
# repositories these machines cannot reach are read from the bundles in ../shared/sources/, by
# git's own URL rewriting in the environment, so every git the runner starts picks it up and the
# locks keep the real URLs (../shared/sources/README.md). A machine with network needs none.
sources="$(cd .. && pwd)/shared/sources"
if [ -f "$sources/openpi-v0.3.0.bundle" ] && [ -f "$sources/terminal-bench-2.1-subset.bundle" ] \
  && [ -f "$sources/terminal-bench-2.0-subset.bundle" ]; then
  export GIT_CONFIG_COUNT=3
  export GIT_CONFIG_KEY_0="url.$sources/openpi-v0.3.0.bundle.insteadOf"
  export GIT_CONFIG_VALUE_0="https://github.com/tt-a1i/openpi.git"
  export GIT_CONFIG_KEY_1="url.$sources/terminal-bench-2.1-subset.bundle.insteadOf"
  export GIT_CONFIG_VALUE_1="https://github.com/laude-institute/terminal-bench-2.git"
  export GIT_CONFIG_KEY_2="url.$sources/terminal-bench-2.0-subset.bundle.insteadOf"
  export GIT_CONFIG_VALUE_2="https://github.com/yujianll/skill-usage.git"
fi
