import sys

from onnxopt.cli.main import main

sys.exit(main())
