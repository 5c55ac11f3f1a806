"""The Orchard Env quick start, run on a small real repository whose test suite fails until a patch fixes it.

Needs a running env service (`orchard up`, or `orchard serve env`) and the image (`orchard image build
python:3.11-slim`); `bash scripts/main.sh` does all of it.
"""

from pathlib import Path

from aks_modal import SandboxClient

HERE = Path(__file__).resolve().parent
REPO = HERE / "quickstart_repo"
patch_text = (HERE / "quickstart_fix.patch").read_text()

with SandboxClient() as client:
    with client.create_sandbox("python:3.11-slim") as sandbox:
        # Put the repository into the sandbox's /workspace.
        for path in sorted(p for p in REPO.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
            sandbox.upload_file(str(path), str(path.relative_to(REPO)))

        result = sandbox.exec("pytest -q", timeout=600)
        print(result.stdout, result.exit_code)
        sandbox.apply_patch(patch_text)
        result = sandbox.exec("python -m pytest tests/")
        print(result.stdout, result.exit_code)
