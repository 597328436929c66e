#!/usr/bin/env bash
# The real shop of tests/tests/real_shop.rs: django-oscar (tests/shop/
# requirements.txt, pinned) served by gunicorn, its assets by WhiteNoise
# under /static/.
#
#   oscar.sh prepare DATA_DIR   venv, migrated database with one customer and
#                               one product, collected static files, in DATA_DIR;
#                               prints `email=… password=… product=PATH`
#   oscar.sh serve DATA_DIR PORT  runs the shop on 127.0.0.1:PORT (exec)
#   oscar.sh warm               builds the cache only (`make test` does, so
#                               that no test's time bound pays for it)
#
# The venv and a prepared site are kept in $FLASHGATE_TEST_CACHE (default
# ~/.cache/flashgate-tests), keyed by a hash of what they are built from, so
# only the first run installs and migrates (about a minute); later runs copy
# the prepared site. Needs python3 with venv (deploy/local/install-deps.sh
# --test). serve reads OSCAR_CSRF_TRUSTED_ORIGINS and OSCAR_PAGE_MAX_AGE
# (tests/shop/oscarshop/settings.py).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
cache="${FLASHGATE_TEST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/flashgate-tests}"
python="${PYTHON:-$(command -v /usr/bin/python3 || command -v python3)}"
email="shopper@example.com"
password="drop-shopper-pass-1"

# The venv: one per requirements file and Python version.
venv_dir() {
  echo "$cache/oscar-venv-$( (cat "$here/requirements.txt"; "$python" -VV) | sha256sum | cut -c1-16)"
}

ensure_venv() {
  local venv
  venv="$(venv_dir)"
  if [[ ! -f "$venv/.ready" ]]; then
    rm -rf "$venv"
    "$python" -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$here/requirements.txt"
    touch "$venv/.ready"
  fi
  echo "$venv"
}

# Runs Django's manage commands on DATA_DIR with the venv.
django() {
  local venv="$1" data="$2"
  shift 2
  (cd "$here" && OSCAR_DATA_DIR="$data" DJANGO_SECRET_KEY="$(cat "$data/secret_key")" \
    DJANGO_SETTINGS_MODULE=oscarshop.settings "$venv/bin/python" "$@")
}

# Builds (once) the prepared site in the cache; sets `site`. Returns with
# the cache locked (fd 9).
build_site() {
  local venv key
  mkdir -p "$cache"
  # Concurrent tests build the cache once.
  exec 9>"$cache/oscar.lock"
  flock 9
  venv="$(ensure_venv)"
  key="$( (cat "$here/requirements.txt" "$here"/oscarshop/*.py "$0"; "$python" -VV) | sha256sum | cut -c1-16)"
  site="$cache/oscar-site-$key"
  if [[ ! -f "$site/product" ]]; then
    rm -rf "$site.tmp"
    mkdir -p "$site.tmp"
    "$venv/bin/python" -c 'import secrets; print(secrets.token_urlsafe(48))' >"$site.tmp/secret_key"
    django "$venv" "$site.tmp" -m django migrate --noinput >/dev/null
    django "$venv" "$site.tmp" -m django collectstatic --noinput >/dev/null
    django "$venv" "$site.tmp" -m oscarshop.seed "$email" "$password" \
      | sed -n 's/^product //p' >"$site.tmp/product"
    mv "$site.tmp" "$site"
  fi
}

prepare() {
  local data="$1" venv
  build_site
  mkdir -p "$data"
  cp -a "$site/." "$data/"
  flock -u 9
  # Each copy signs its sessions with a key of its own.
  venv="$(venv_dir)"
  "$venv/bin/python" -c 'import secrets; print(secrets.token_urlsafe(48))' >"$data/secret_key"
  echo "email=$email password=$password product=$(cat "$data/product")"
}

serve() {
  local data="$1" port="$2" venv
  venv="$(ensure_venv)"
  cd "$here"
  OSCAR_DATA_DIR="$data" DJANGO_SECRET_KEY="$(cat "$data/secret_key")" \
    DJANGO_SETTINGS_MODULE=oscarshop.settings \
    exec "$venv/bin/gunicorn" oscarshop.wsgi:application \
    --bind "127.0.0.1:$port" --workers 2 --threads 4 \
    --access-logfile - --error-logfile -
}

case "${1:-}" in
  prepare) prepare "$2" ;;
  serve) serve "$2" "$3" ;;
  warm) build_site ;;
  *) echo "usage: $0 prepare DATA_DIR | serve DATA_DIR PORT | warm" >&2; exit 2 ;;
esac
