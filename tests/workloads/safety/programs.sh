#!/bin/bash
# The differential harness's programs (tests/tests/probe_safety.rs): each one's stdout, stderr
# and exit status go to $1/<name>.{out,err,rc}. $2: the directory of the built helpers and of
# a fixed tree to list. ONLY="name ..." runs only those.
out=$1
bin=$2
run() {
    local name=$1
    shift
    if [ -n "$ONLY" ] && [[ " $ONLY " != *" $name "* ]]; then
        return
    fi
    "$@" >"$out/$name.out" 2>"$out/$name.err"
    echo $? >"$out/$name.rc"
}
run bash-printf bash -c 'printf "%s-%d %5.2f|%-4s|%x\n" hello 1 3.14159 ab 255; printf "%q\n" "a b"; [ -n "$HOME" ] && echo test-ok'
run bash-subshell bash -c 'x=$(echo a; (echo b; echo c) | tr a-z A-Z); echo "[$x]"; echo $((6*7)); f() { local v=$1; echo "${v^^}-${#v}"; }; f word; (exit 3); echo "sub=$?"'
run bash-glob bash -c 'cd "$0" && shopt -s nullglob && for f in tree/*.txt tree/*/; do echo "$f"; done; case abc in a*) echo glob-case;; esac; echo ${PWD##*/}' "$bin"
run bash-pipe bash -c 'seq 1 2000 | sort -rn | head -3; printf "b\na\nc\n" | sort | tr "\n" ,; echo; echo oops >&2; exit 3'
run python /usr/bin/python3 -c 'import json, re; d = json.loads("{\"a\": [1, 2.5, null], \"b\": \"\\u00e9\"}"); print(json.dumps(d, sort_keys=True)); print(re.findall(r"(\w+)@(\w+)\.com", "x@y.com z@w.com")); print(sum(i*i for i in range(10000)), 2**100, 1/3); import zlib; data = zlib.compress(b"probe " * 500); print(zlib.crc32(data), len(data), zlib.decompress(data)[:12])'
run sqlite sqlite3 :memory: "create table t(a integer, b text); insert into t values (1,'one'),(2,'two'),(3,'three'); with recursive c(x) as (select 1 union all select x+1 from c where x<1000) select count(*), sum(x), printf('%.3f', avg(x)) from c; select group_concat(b, '-') from t order by a; select upper(b), length(b) from t where a>1; select hex(zeroblob(2)), abs(-5), round(2.567, 2), length(printf('%0500d', 7)); select nosuchfunction(1);"
run sort sort -t: -k3,3n -k1,1 /etc/passwd
run ls ls -l --time-style=+ "$bin/tree"
run cxx "$bin/throw"
run libpython "$bin/embed" 'import json, re, math; print(json.dumps({"k": [math.sqrt(2), re.sub(r"a+", "-", "caaab")]})); raise SystemExit(4)'
