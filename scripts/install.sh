#!/usr/bin/env bash
# Installs libmuon_opt under a prefix, as a C/C++ project consumes it:
#   PREFIX/lib/libmuon_opt.so.X.Y.Z  + libmuon_opt.so.ABI (the soname) + libmuon_opt.so
#   PREFIX/include/muon_opt.h, muon_opt.hpp
#   PREFIX/lib/pkgconfig/muon_opt.pc                       (pkg-config --cflags --libs muon_opt)
#   PREFIX/lib/cmake/muon_opt/muon_optConfig.cmake        (find_package(muon_opt CONFIG) →
#   PREFIX/lib/cmake/muon_opt/muon_optConfigVersion.cmake  imported target muon_opt::muon_opt)
# Usage: bash scripts/install.sh PREFIX    (builds the release library first if needed)
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 1 ] || { echo "usage: bash scripts/install.sh PREFIX" >&2; exit 2; }
mkdir -p "$1"
prefix=$(cd "$1" && pwd)

version=$(awk -F'"' '/^version *=/ {print $2; exit}' Cargo.toml)
IFS=. read -r major minor patch <<<"$version"
if [ "$major" = 0 ]; then abi="0.$minor"; else abi="$major"; fi

cargo build --release --locked --lib
built=target/release/libmuon_opt.so
soname=$(readelf -d "$built" | sed -n 's/.*Library soname: \[\(.*\)\].*/\1/p')
[ "$soname" = "libmuon_opt.so.$abi" ] || { echo "$built has soname '$soname', expected libmuon_opt.so.$abi" >&2; exit 1; }

install -d "$prefix/lib" "$prefix/include" "$prefix/lib/pkgconfig" "$prefix/lib/cmake/muon_opt"
install -m 0755 "$built" "$prefix/lib/libmuon_opt.so.$version"
ln -sfn "libmuon_opt.so.$version" "$prefix/lib/libmuon_opt.so.$abi"
ln -sfn "libmuon_opt.so.$abi" "$prefix/lib/libmuon_opt.so"
install -m 0644 include/muon_opt.h include/muon_opt.hpp "$prefix/include/"

# Relative to the .pc file, so the prefix can be moved (as the CMake package below).
cat >"$prefix/lib/pkgconfig/muon_opt.pc" <<PC
prefix=\${pcfiledir}/../..
libdir=\${prefix}/lib
includedir=\${prefix}/include

Name: muon_opt
Description: Muon optimizer with layer-wise data-parallel ownership (C ABI)
Version: $version
Libs: -L\${libdir} -lmuon_opt
Cflags: -I\${includedir}
PC

# Relative to the package directory, so the prefix can be moved.
cat >"$prefix/lib/cmake/muon_opt/muon_optConfig.cmake" <<'CMAKE'
# find_package(muon_opt CONFIG) → imported target muon_opt::muon_opt (library + both headers).
get_filename_component(_muon_prefix "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
if(NOT TARGET muon_opt::muon_opt)
    add_library(muon_opt::muon_opt SHARED IMPORTED)
    set_target_properties(muon_opt::muon_opt PROPERTIES
        IMPORTED_LOCATION "${_muon_prefix}/lib/libmuon_opt.so.@VERSION@"
        IMPORTED_SONAME "libmuon_opt.so.@ABI@"
        INTERFACE_INCLUDE_DIRECTORIES "${_muon_prefix}/include")
endif()
set(muon_opt_INCLUDE_DIRS "${_muon_prefix}/include")
set(muon_opt_LIBRARIES muon_opt::muon_opt)
unset(_muon_prefix)
CMAKE
sed -i -e "s/@VERSION@/$version/" -e "s/@ABI@/$abi/" "$prefix/lib/cmake/muon_opt/muon_optConfig.cmake"

# Compatible: the same ABI (same MAJOR from 1.0 on; the same 0.MINOR before) and not older.
cat >"$prefix/lib/cmake/muon_opt/muon_optConfigVersion.cmake" <<CMAKE
set(PACKAGE_VERSION "$version")
set(PACKAGE_VERSION_COMPATIBLE FALSE)
if(PACKAGE_FIND_VERSION VERSION_LESS_EQUAL PACKAGE_VERSION)
    if("$major" STREQUAL "0")
        if(PACKAGE_FIND_VERSION_MAJOR STREQUAL "0" AND PACKAGE_FIND_VERSION_MINOR STREQUAL "$minor")
            set(PACKAGE_VERSION_COMPATIBLE TRUE)
        endif()
    elseif(PACKAGE_FIND_VERSION_MAJOR STREQUAL "$major")
        set(PACKAGE_VERSION_COMPATIBLE TRUE)
    endif()
endif()
if(PACKAGE_FIND_VERSION STREQUAL PACKAGE_VERSION)
    set(PACKAGE_VERSION_EXACT TRUE)
endif()
CMAKE
echo "installed libmuon_opt $version (soname libmuon_opt.so.$abi) under $prefix"
