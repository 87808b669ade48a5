pytest_plugins = ["tests.fakekube.plugin"]
