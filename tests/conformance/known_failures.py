"""Cases onnxruntime passes but onnxopt breaks: onnxopt bugs, marked xfail(strict=True, raises=...) so the suite
stays green, a different failure in these cases still fails, and a fix shows up as XPASS(strict) -- then delete
the case's line here.

    id -> (exception type the case fails with, precise reason)

for example

    from onnxopt.errors import OnnxoptError
    "test_operator_repeat": (OnnxoptError, "onnxopt bug: IR 3 model: folded Constant nodes become initializers "
                                           "that are not graph inputs; optimize() fails the ONNX checker"),

Empty now: the 32 cases that failed at commit 9a5fe5a (IR 3 initializers; unknown region input shapes in
fusion; SymbolicShapeInference rewriting a sequence output and writing wrong shapes into value_info; folded If
conditions) pass with the fixes in onnxopt/{emit/model,fusion/elementwise,graph/fold,graph/load,pipeline}.py.
"""

KNOWN_FAILURES: dict[str, tuple[type[BaseException], str]] = {}
