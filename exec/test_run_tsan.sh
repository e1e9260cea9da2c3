#!/bin/sh
# The runner's race stress (exec/stress_run.c) under ThreadSanitizer, in a build of its own:
# exec/run*.c and what they need compiled with -fsanitize=thread into $COWBOX_BUILDDIR/exec/tsan
# (cached: rebuilt when a source is newer), run with halt_on_error so a data race fails the
# test; then the same stress built plainly, which also checks every command's output.
set -eu
src=${COWBOX_SRCDIR:?run through make check}
build=${COWBOX_BUILDDIR:?run through make check}
out=$build/exec/tsan
cc=${CC:-gcc}
# The .c files of an automake variable in a local.mk (continued lines joined), so that the
# stress always links what the runner's layer is made of.
sources_of() { # local.mk variable
	sed -e ':a' -e '/\\$/N; s/\\\n//; ta' "$src/$1" | sed -n "s/^$2 *+*= *//p" |
		tr ' \t' '\n\n' | grep '\.c$' || true
}
srcs="exec/stress_run.c $(sources_of exec/local.mk exec_libcb_exec_la_SOURCES)
      $(sources_of util/local.mk util_libcb_util_la_SOURCES)"
mkdir -p "$out"

build_one() { # name extra-cflags
	bin=$out/$1
	stale=
	if [ ! -x "$bin" ]; then
		stale=1
	else
		for f in $srcs exec/run.h exec/internal.h include/cowbox/exec.h; do
			[ "$src/$f" -nt "$bin" ] && stale=1
		done
		[ "$build/config.h" -nt "$bin" ] && stale=1
	fi
	if [ -n "$stale" ]; then
		files=
		for f in $srcs; do files="$files $src/$f"; done
		# shellcheck disable=SC2086
		$cc -std=gnu11 -g -O1 -pthread $2 -I"$build" -I"$src" -I"$src/include" \
			-o "$bin.tmp" $files -lseccomp
		mv "$bin.tmp" "$bin"
	fi
}

if ! echo 'int main(void){return 0;}' | $cc -fsanitize=thread -x c -o "$out/probe" - 2>/dev/null; then
	echo "SKIP: $cc cannot build with -fsanitize=thread"
	exit 77
fi
build_one stress-tsan "-fsanitize=thread"
build_one stress-plain ""

start=$(date +%s)
TSAN_OPTIONS="halt_on_error=1 exitcode=66 second_deadlock_stack=1" "$out/stress-tsan" "${COWBOX_TSAN_ITERATIONS:-25}"
"$out/stress-plain" 15
echo "race stress: $(( $(date +%s) - start )) s"
