"""The sandbox executor service (`antwort-grpc executor sandbox`): runs Python code, isolated.

service.py offers `run_python` (claimed by a request's `code_interpreter` tool); runner.py runs one
call; child.py hardens the child process and keeps the code; seccomp.py is the code's seccomp
filter; isolation.py says what this machine allows; session.py finds (and at the end kills) a
call's processes, budget.py watches their memory; limits.py and settings.py hold the limits;
output.py is the result's JSON. docs/sandbox.md is the user guide.
"""

from antwort_grpc.tool_services.sandbox.service import SandboxError, SandboxService
from antwort_grpc.tool_services.sandbox.settings import SandboxSettings

__all__ = ["SandboxError", "SandboxService", "SandboxSettings"]
