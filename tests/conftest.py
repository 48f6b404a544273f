pytest_plugins = ["tests.pdsfixture"]
