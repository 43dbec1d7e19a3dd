/*
 * The assertions of softrnic's C test programs: CHECK counts and reports,
 * MUST also ends the program (the rest cannot run). Each evaluates its
 * condition once, since it is often the call under test. finish prints
 * "N passed, M failed" and exits non-zero on any failure.
 */
#ifndef SRN_CHECK_H
#define SRN_CHECK_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

static int passed, failed;

static void finish(void)
{
	printf("%d passed, %d failed\n", passed, failed);
	exit(failed ? 1 : 0);
}

__attribute__((format(printf, 5, 6))) static bool check(bool ok, const char *file, int line, const char *cond,
							const char *fmt, ...)
{
	if (ok) {
		passed++;
		return true;
	}
	failed++;
	fprintf(stderr, "FAIL %s:%d: %s: ", file, line, cond);
	va_list ap;
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	return false;
}

#define CHECK(cond, ...) check((cond), __FILE__, __LINE__, #cond, __VA_ARGS__)
#define MUST(cond, ...)                                                  \
	do {                                                             \
		if (!check((cond), __FILE__, __LINE__, #cond, __VA_ARGS__)) \
			finish();                                        \
	} while (0)

#endif
