"""The Python the user data carries: profiling/qualifyio.py, tuning/hostpost.py and tuning/hostqualify.py as one
program, compressed, which the script runs as `hostpy post` (a failed setup's event) or `hostpy qualify ...`.

User data is limited to 16 KB, Batch's part included (EC2 User Guide, "Run commands when you launch an EC2 instance
with user data input"), so the program goes without docstrings, comments, annotations, deep indents and the imports
between its parts, zlib-compressed and base85-encoded (python3's zlib and base64 modules: the ECS-optimized AL2023 AMI
has both; base85's characters need no escaping in single quotes). ast.unparse keeps the code as 3.9-compatible as the
sources are (tests/unit/test_hostpost.py).
"""

from __future__ import annotations

import ast
import base64
import functools
import zlib
from pathlib import Path

from profiling import qualifyio
from tuning import hostpost, hostqualify

PARTS = (qualifyio, hostpost, hostqualify)
PROJECT = ("profiling", "tuning")
# The commands `hostpy` takes: the name after the program, and the function that runs it.
DISPATCH = "sys.exit({'post': main, 'qualify': qualify_main}[sys.argv[2]]())"
# How the script runs it: python3 isolated (-I), the program in argv[1], the command and its arguments after.
LAUNCHER = ("import base64,sys,zlib;exec(compile(zlib.decompress(base64.b85decode(sys.argv[1])),'iobatch-host',"
            "'exec'))")


class _Strip(ast.NodeTransformer):
    """No docstrings, annotations, __future__ or project imports, nor `if __name__ == "__main__":` blocks."""

    def generic_visit(self, node: ast.AST) -> ast.AST:
        body = getattr(node, "body", None)
        if (isinstance(node, ast.Module | ast.FunctionDef | ast.ClassDef) and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
        if isinstance(node, ast.FunctionDef):
            node.returns = None
        elif isinstance(node, ast.arg):
            node.annotation = None
        return super().generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AST:
        assert node.value is not None, "the host program annotates only assignments"
        return ast.copy_location(ast.Assign(targets=[node.target], value=node.value, lineno=node.lineno), node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> ast.AST | None:
        module = node.module or ""
        return None if module == "__future__" or module.split(".")[0] in PROJECT else node

    def visit_If(self, node: ast.If) -> ast.AST | None:
        test = node.test
        if (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__"):
            return None
        return self.generic_visit(node)


def _compact(path: Path) -> str:
    tree = _Strip().visit(ast.parse(path.read_text()))
    # unparse indents by four spaces a level and writes no literal over two lines: one space a level is the same code.
    lines = ast.unparse(tree).splitlines()
    return "\n".join(" " * ((len(line) - len(line.lstrip(" "))) // 4) + line.lstrip(" ") for line in lines if line)


@functools.cache
def program_source() -> str:
    """The program, readable (what `program_blob` compresses)."""
    return "\n".join([*(_compact(Path(part.__file__ or "")) for part in PARTS), DISPATCH]) + "\n"


@functools.cache
def program_blob() -> str:
    """The program as the user data carries it: zlib at level 9, base85."""
    return base64.b85encode(zlib.compress(program_source().encode(), 9)).decode()
