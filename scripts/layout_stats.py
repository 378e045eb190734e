"""Lines per folder of reluformer_mt and its largest functions (issue 35's before/after layout):
``python scripts/layout_stats.py [REPO]``."""
import ast, sys
from collections import Counter
from pathlib import Path

root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[1]) / "reluformer_mt"
per = Counter(); files = Counter()
funcs = []
for p in sorted(root.rglob("*.py")):
    rel = p.relative_to(root)
    folder = rel.parts[0] if len(rel.parts) > 1 else "(root)"
    text = p.read_text(encoding="utf-8")
    per[folder] += len(text.splitlines()); files[folder] += 1
    tree = ast.parse(text)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            funcs.append((node.end_lineno - node.lineno + 1, f"{rel}:{node.name}"))
for k in sorted(per):
    print(f"{k:14s} {files[k]:3d} files {per[k]:6d} lines")
print(f"{'total':14s} {sum(files.values()):3d} files {sum(per.values()):6d} lines")
print("largest functions:")
for n, name in sorted(funcs, reverse=True)[:10]:
    print(f"  {n:4d}  {name}")
