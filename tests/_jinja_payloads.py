"""Jinja templates that try to build a huge value, or burn CPU, inside one operation. Each must be refused (a
TemplateError) quickly and with bounded memory. Shared by the template tests and the peak-RSS measurement."""

BIG = "{% set s = 'a' * 8000000 %}"  # one value right at the cap: building more from it is what gets refused

HOSTILE = [
    # amplifying filters
    "{{ ('a' * 40000)|replace('a', 'b' * 40000) }}",
    "{{ ('a' * 40000)|replace('', 'b' * 40000) }}",
    "{{ ('a\n' * 400000)|indent(4000) }}",
    "{{ ('a\n' * 400000)|indent('b' * 4000) }}",
    "{{ ('a' * 1000000)|wordwrap(1) }}",
    "{{ ('a ' * 500000)|wordwrap(1) }}",
    "{{ 'x y'|wordwrap(1, wrapstring='y' * 8000000) }}",
    "{{ ('ab' * 4000)|wordwrap(2, wrapstring='y' * 4000) }}",
    "{{ 'x'|center(8000000) ~ 'x'|center(8000000) }}",
    "{{ 'x'|center(1000000000) }}",
    "{{ (['b' * 8000000] * 1000)|join }}",
    "{{ ['a', 'b', 'c']|join('c' * 5000000) }}",
    "{{ '%1500000000d'|format(1) }}",
    "{{ '%*d'|format(8000000, 1) ~ '%*d'|format(8000000, 1) }}",
    "{{ '%.1000000000f'|format(1.5) }}",
    "{{ ([('a' * 1000000)] * 1000)|tojson }}",
    "{{ ['a', 'b', 'c']|tojson(indent=8000000) }}",
    "{{ ([[[[1]]]] * 100000)|pprint }}",
    "{{ ('a ' * 3000000)|title }}",
    "{{ ('&' * 3000000)|e }}",
    "{{ ('ab' * 3000000)|urlencode }}",
    "{{ ('x.com ' * 500000)|urlize(target='t' * 1000) }}",
    "{{ ([[1] * 1000000] * 100)|sum(start=[]) }}",
    "{{ [1]|batch(8000000, 0)|list }}",
    "{{ [1]|slice(8000000)|list }}",
    "{{ (('a' * 1000000)|list) * 8 }}",
    "{{ {'a': 'b' * 8000000, 'c': 'd' * 8000000}|xmlattr }}",
    # str methods
    "{{ '{:>1500000000}'.format(1) }}",
    "{{ '{:>{w}}'.format(1, w=1500000000) }}",
    "{{ '{:.1000000000f}'.format(1.5) }}",
    "{{ ('{0}' * 100000).format('a' * 10000) }}",
    "{{ '{0!r}'.format(['a' * 1000000] * 1000) }}",
    "{{ '{a}'.format_map({'a': 1}) }}{{ '{a:>900000000}'.format_map({'a': 1}) }}",
    "{{ ('\t' * 200000).expandtabs(8000) }}",
    "{{ 'x'.ljust(8000000) ~ 'y'.rjust(8000000) }}",
    "{{ 'x'.zfill(1000000000) }}",
    "{{ ('a' * 40000).replace('a', 'b' * 40000) }}",
    "{{ ('c' * 8000000).join(['a'] * 1000) }}",
    "{{ ('a' * 4000000).translate({97: 'b' * 1000}) }}",
    "{{ ('a ' * 4000000).split() }}",
    "{{ ('a\n' * 4000000).splitlines() }}",
    "{{ ('\u00e9' * 4000000).encode('unicode_escape') }}",
    "{{ strftime_now('%c' * 1000000) }}",
    "{{ (1).to_bytes(8000000, 'big') * 2 }}",
    # operators, slices, output
    "{{ '%1500000000d' % 1 }}",
    "{{ '%-*s' % (1500000000, 'x') }}",
    "{{ 'x' * 10**9 }}",
    "{{ 'x'.encode() * 10**9 }}",
    "{{ messages * 100000000 }}",
    BIG + "{{ s + s }}",
    BIG + "{{ [s] * 1000 }}",
    BIG + "{{ ([s] * 1000) ~ '' }}",
    BIG + "{% for i in range(100) %}{% set t = s[::-1] %}{% set u = s[1:] %}{% endfor %}{{ t|length }}",
    BIG + "{% macro m(n) %}{% set t = s[n:] %}{{ m(n + 1) }}{% endmacro %}{{ m(0) }}",
    BIG + "{% set ns = namespace(l=[]) %}{% for i in range(100) %}{% set ns.l = ns.l + [s[i:]] %}{% endfor %}",
    "{% macro m() %}{% for i in range(100000) %}" + "x" * 1000 + "{% endfor %}{% endmacro %}{{ m()|length }}",
    "{% macro m() %}{% for i in range(100000) %}{{ 'y' * 1000 }}{% endfor %}{% endmacro %}{% set x = m() %}",
    "{% set x %}{% for i in range(100000) %}{{ 'y' * 1000 }}{% endfor %}{% endset %}{{ x|length }}",
    "{% filter upper %}{% for i in range(100000) %}{{ 'y' * 1000 }}{% endfor %}{% endfilter %}",
    "{% set ns = namespace(n=3) %}{% for i in range(64) %}{% set ns.n = ns.n * ns.n %}{% endfor %}",
    "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    "{% set ns = namespace(a=1) %}{% set ns.a = ns %}{{ ns }}",
]

# quadratic in the library code (minutes): linear now, so they finish (or are refused) in well under a second
BOUNDED = [
    "{{ ('<!---->' * 300000)|striptags }}",
    "{{ ('<a>' * 1000000)|striptags }}",
    "{{ ('<!--' + '<!-' * 100000 + '-->')|striptags }}",
    "{{ ('a' * 100000)|wordwrap(1)|length }}",
    "{{ ('a-' * 100000)|wordwrap(3)|length }}",
    "{{ (('a' * 100000)|e).striptags() }}",
]

# templates Python's compiler refuses although Jinja parses them, or that nest too deep to parse
UNCOMPILABLE = [
    "{% for a in messages %}" * 25 + "{% endfor %}" * 25,
    "{{ 1" + "+1" * 50000 + " }}",
    "{{ x" + "|upper" * 20000 + " }}",
    "{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}",
    "{{ " + "[" * 5000 + "]" * 5000 + " }}",
]
