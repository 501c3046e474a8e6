#!/usr/bin/env python3
"""tools/check_co_await.py on small C++ snippets: the shapes it must report and the ones it must leave alone."""
import os
import subprocess
import sys
import tempfile
import unittest

CHECK = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'check_co_await.py')


def check(code):
    with tempfile.NamedTemporaryFile('w', suffix='.cc', delete=False) as f:
        f.write(code)
    try:
        run = subprocess.run([sys.executable, CHECK, f.name], capture_output=True, text=True)
        return run.returncode, run.stdout
    finally:
        os.unlink(f.name)


class CheckCoAwaitTest(unittest.TestCase):
    def test_reports_temporaries_inside_a_co_await(self):
        for code in ['co_return co_await WriteChunk(": " + std::string(text) + "\\n\\n");',
                     'co_await stream.Send("reset", data.dump(), id);',
                     'auto r = co_await Call(c, std::to_string(n));',
                     'co_await Write(json{{"a", 1}}, 11);',
                     'co_await Run(std::function<void()>(f));',
                     'bool ok = co_await Post(\n    "/api/" + path,\n    body);']:
            rc, out = check('void f() {\n  ' + code + '\n}\n')
            self.assertEqual(rc, 1, code)
            self.assertIn('inside a co_await', out)

    def test_leaves_named_values_lambda_bodies_and_comments_alone(self):
        for code in ['std::string frame = ": " + t;\n  co_await WriteChunk(std::move(frame));',
                     'auto r = co_await Offload(pool, [&]() -> StatusOr<std::vector<int>> { return f("a" + b); });',
                     'co_await Offload(pool, [&] { return s.Get(std::to_string(id)); });',
                     '// co_await Send("x" + y);\n  co_await Send(x);',
                     'co_await Comment("keep-alive");',
                     'Log("co_await " + x);']:
            rc, out = check('void f() {\n  ' + code + '\n}\n')
            self.assertEqual(rc, 0, code + '\n' + out)


if __name__ == '__main__':
    unittest.main()
