/*-------------------------------------------------------------------------
 *
 * capture_json.c
 *	  JSON as Kafka Connect's JsonConverter writes it with Jackson: the
 *	  bytes a consumer of Debezium's records reads, which capture_row.c
 *	  writes for JsonConverter keys, values and envelopes.  Everything here
 *	  takes and writes UTF-8, as Kafka Connect does whatever the database's
 *	  encoding.
 *
 * Jackson writes JSON compact (nothing after ':' or ','); in a string it
 * escapes '"', '\' and the control characters (\b \t \n \f \r, the others
 * as \u00XX in upper-case hexadecimal), writes every other character of
 * the Basic Multilingual Plane as its UTF-8 bytes, and one outside it as
 * the escapes of its UTF-16 surrogate pair (\uD83D\uDE00).  A double is
 * written as Java's Double.toString() writes it (1.0E-7, 100.0, 0.001),
 * an infinite one as the string "Infinity".  Kafka Connect's
 * StringConverter and SimpleHeaderConverter write a float as Java does too.
 *
 * capture_expand.c expands a payload as EventRouter does, and writes it
 * with these.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <math.h>

#include "mb/pg_wchar.h"

#include "capture.h"

/* Java's Double.toString(): plain notation for 10^-3 <= |d| < 10^7. */
#define JAVA_PLAIN_MIN_EXPONENT		(-3)
#define JAVA_PLAIN_MAX_EXPONENT		7
#define JAVA_MAX_DIGITS				17	/* a double never needs more */

static void
append_escape(StringInfo out, unsigned int code_unit)
{
	appendStringInfo(out, "\\u%04X", code_unit);
}

/*
 * A JSON string of UTF-8 text.  A 3-byte sequence may also be a lone
 * surrogate (read from a \uD800 escape, which Jackson takes too).
 */
void
capture_json_string(StringInfo out, const char *text, int len)
{
	const unsigned char *p = (const unsigned char *) text;
	const unsigned char *end = p + len;

	appendStringInfoChar(out, '"');
	while (p < end)
	{
		int			n = pg_utf_mblen(p);
		pg_wchar	c;

		if (*p >= 0x80)
		{
			c = utf8_to_unicode(p);
			if (c >= 0x10000)
			{
				append_escape(out, 0xD800 + ((c - 0x10000) >> 10));
				append_escape(out, 0xDC00 + ((c - 0x10000) & 0x3FF));
			}
			else if (c >= 0xD800 && c <= 0xDFFF)
				append_escape(out, c);
			else
				appendBinaryStringInfo(out, (const char *) p, n);
			p += n;
			continue;
		}
		switch (*p)
		{
			case '"':
			case '\\':
				appendStringInfoChar(out, '\\');
				appendStringInfoChar(out, *p);
				break;
			case '\b':
				appendStringInfoString(out, "\\b");
				break;
			case '\t':
				appendStringInfoString(out, "\\t");
				break;
			case '\n':
				appendStringInfoString(out, "\\n");
				break;
			case '\f':
				appendStringInfoString(out, "\\f");
				break;
			case '\r':
				appendStringInfoString(out, "\\r");
				break;
			default:
				if (*p < 0x20)
					append_escape(out, *p);
				else
					appendStringInfoChar(out, *p);
		}
		p++;
	}
	appendStringInfoChar(out, '"');
}

/*
 * The digits of a number printf's %e wrote, and the decimal exponent of
 * the first; returns how many digits.
 */
static int
read_decimal(const char *s, char *digits, int *exponent)
{
	int			n = 0;

	for (; *s && *s != 'e'; s++)
		if (isdigit((unsigned char) *s))
			digits[n++] = *s;
	digits[n] = '\0';
	*exponent = atoi(s + 1);
	return n;
}

/* Does this decimal read back as the value, rounded to the nearest? */
static bool
reads_back(const char *decimal, double value, bool is_float)
{
	return is_float ? strtof(decimal, NULL) == (float) value : strtod(decimal, NULL) == value;
}

/*
 * The decimal of that many digits next to the one %e wrote, above or below
 * it (step +1 or -1 in its last digit), written as %e writes.
 */
static void
step_decimal(const char *decimal, int step, char *next, size_t size)
{
	char		digits[32];
	int			exponent;
	int			n = read_decimal(decimal, digits, &exponent);

	for (int i = n - 1; i >= 0; i--)
	{
		digits[i] += step;
		if (digits[i] >= '0' && digits[i] <= '9')
			break;
		digits[i] = step > 0 ? '0' : '9';	/* carried on */
		if (i == 0)
		{
			/* 9.99 + 1 is 1.00 and 1.00 - 1 is 9.99, an exponent away */
			digits[0] = step > 0 ? '1' : '9';
			exponent += step;
		}
	}
	snprintf(next, size, "%c.%se%d", digits[0], digits + 1, exponent);
}

/*
 * The decimal of that many digits closest to the value that reads back as
 * it, into decimal; false if there is none.  %e's own may not read back
 * where the value's neighbours are not as far above as below (a power of
 * two): then the one on the other side may.
 */
static bool
closest_reading_back(double value, int precision, bool is_float, char *decimal, size_t size)
{
	char		other[64];

	snprintf(decimal, size, "%.*e", precision - 1, value);
	if (reads_back(decimal, value, is_float))
		return true;
	for (int step = -1; step <= 1; step += 2)
	{
		step_decimal(decimal, step, other, sizeof(other));
		if (reads_back(other, value, is_float))
		{
			strlcpy(decimal, other, size);
			return true;
		}
	}
	return false;
}

/*
 * A double or a float as Java's Double.toString() or Float.toString()
 * writes it (Java 19 and later): of the decimals that read back as the
 * value, the shortest (but of two digits where one would do: 4.9E-324,
 * not 5E-324), and of those the closest; plain between 10^-3 and 10^7,
 * else as 1.0E-7.  printf's %e rounds exactly, so the first precision
 * at which it, or a neighbour, reads back gives that decimal.
 * (PostgreSQL's shortest output differs where a decimal only reads back
 * by rounding a tie to even: 1.0E23, not 9.999999999999999E22.)
 */
void
capture_java_number(StringInfo out, double value, bool is_float)
{
	char		decimal[64];
	char		digits[32];
	int			exponent;
	int			precision;
	int			ndigits;

	if (isnan(value) || isinf(value))
	{
		appendStringInfoString(out, isnan(value) ? "NaN" : value > 0 ? "Infinity" : "-Infinity");
		return;
	}
	if (signbit(value))
		appendStringInfoChar(out, '-');
	if (value == 0)
	{
		appendStringInfoString(out, "0.0");
		return;
	}
	for (precision = 1; precision < JAVA_MAX_DIGITS; precision++)
		if (closest_reading_back(fabs(value), precision, is_float, decimal, sizeof(decimal)))
			break;
	if (precision == JAVA_MAX_DIGITS)
		snprintf(decimal, sizeof(decimal), "%.*e", JAVA_MAX_DIGITS - 1, fabs(value));
	else if (precision == 1)
	{
		char		two_digits[64];

		if (closest_reading_back(fabs(value), 2, is_float, two_digits, sizeof(two_digits)))
			strlcpy(decimal, two_digits, sizeof(decimal));
	}
	ndigits = read_decimal(decimal, digits, &exponent);
	while (ndigits > 1 && digits[ndigits - 1] == '0')
		digits[--ndigits] = '\0';	/* 1.0e+23 is 1E23 */
	if (exponent >= JAVA_PLAIN_MIN_EXPONENT && exponent < JAVA_PLAIN_MAX_EXPONENT)
	{
		if (exponent < 0)
		{
			appendStringInfoString(out, "0.");
			for (int i = exponent + 1; i < 0; i++)
				appendStringInfoChar(out, '0');
			appendStringInfoString(out, digits);
			return;
		}
		for (int i = 0; i <= exponent; i++)
			appendStringInfoChar(out, i < ndigits ? digits[i] : '0');
		appendStringInfoChar(out, '.');
		if (ndigits > exponent + 1)
			appendStringInfoString(out, digits + exponent + 1);
		else
			appendStringInfoChar(out, '0');
		return;
	}
	appendStringInfo(out, "%c.%sE%d", digits[0], ndigits > 1 ? digits + 1 : "0", exponent);
}

/* A number as Jackson writes a double or float: NaN and Infinity quoted. */
void
capture_json_number(StringInfo out, double value, bool is_float)
{
	bool		quoted = isnan(value) || isinf(value);

	if (quoted)
		appendStringInfoChar(out, '"');
	capture_java_number(out, value, is_float);
	if (quoted)
		appendStringInfoChar(out, '"');
}
