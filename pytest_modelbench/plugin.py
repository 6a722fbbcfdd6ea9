"""pytest entry point: parse options and register modelbench's plugin objects.

Behaviour lives in small registered classes (``session.core.ModelbenchSession``,
``reporting.writer.ReportWriter``, ``session.resume.ResumePlugin``,
``scheduling.ModelbenchDist``); this module only wires them, as pytest's
``cacheprovider.pytest_configure`` registers ``LFPlugin``.

Every pytest session in the environment loads this module, most of them without a
benchmark item, so at start-up it imports only the options. The session and everything
behind it are imported and registered when the options select benchmark items (``--model``,
``--mb-config``; ``--mb-dist``), or when a test asks for ``mb_item``/``mb_eval``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from pytest_modelbench import hookspecs
from pytest_modelbench.config.options import ReportOptions, RunOptions, add_options
from pytest_modelbench.errors import EvaluationError, ModelbenchUsageError
from pytest_modelbench.workers import is_worker

if TYPE_CHECKING:
    from pytest_modelbench.session.core import ModelbenchSession
    from pytest_modelbench.store.result import EvalResult

SESSION_PLUGIN = "modelbench-session"  # the registered ModelbenchSession, once started
OPTIONS_KEY = pytest.StashKey[tuple[RunOptions, ReportOptions]]()


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "modelbench(model=None, env=None, variant=None): restrict which items a test using "
        "mb_eval is parametrized with (names or lists of names)",
    )
    try:
        options = RunOptions.from_config(config)
        report_options = ReportOptions.from_config(config)
    except ModelbenchUsageError as exc:
        raise pytest.UsageError(str(exc)) from None
    config.stash[OPTIONS_KEY] = (options, report_options)
    if options.selects_items or options.dist is not None:
        start_session(config)


def start_session(config: pytest.Config) -> ModelbenchSession:
    """Create and register the session and its plugins (once per process)."""
    started = config.pluginmanager.get_plugin(SESSION_PLUGIN)
    if started is not None:
        session: ModelbenchSession = started
        return session
    # lazily: sessions without benchmark items never load these (pytest start-up)
    from pytest_modelbench import scheduling
    from pytest_modelbench.session.core import SESSION_KEY, ModelbenchSession
    from pytest_modelbench.session.resume import register as register_resume

    options, report_options = config.stash[OPTIONS_KEY]
    session = ModelbenchSession(config, options)
    config.stash[SESSION_KEY] = session
    config.pluginmanager.register(session, SESSION_PLUGIN)
    if session.active:
        # lazily: only sessions with benchmark items report (pytest start-up)
        from pytest_modelbench.reporting.writer import register as register_reports

        register_reports(config, report_options, session)  # live progress, pytest-html, reports
        if report_options.trackers and not is_worker(config):
            # lazily: only sessions that log to W&B/MLflow load the trackers (pytest start-up)
            from pytest_modelbench.reporting.trackers import register as register_trackers

            register_trackers(
                config,
                report_options.trackers,
                report_options.tracker_project,
                lambda: session.run_dir.name,
                session.tracker_config,
                lambda: {r.item_id: r.verdict_text for r in session.records},
            )
    scheduling.register(config, options.dist, lambda: session.active, session.plan_costs)
    register_resume(config)  # crash-proof --lf, item duration memory, --restart check
    return session


@pytest.hookimpl(tryfirst=True)
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test asks for benchmark items in a session whose options selected none: start the
    session now; it reports what is missing (registered during this call, it is called
    directly for this test)."""
    config = metafunc.config
    if (
        "mb_item" in metafunc.fixturenames
        and config.pluginmanager.get_plugin(SESSION_PLUGIN) is None
    ):
        start_session(config).pytest_generate_tests(metafunc)


@pytest.hookimpl(trylast=True)
def pytest_modelbench_make_backend(module: str) -> Any:
    # lazily: loaded only when the hook runs (pytest start-up)
    from pytest_modelbench.backends.registry import resolve_builtin

    return resolve_builtin(module)


@pytest.fixture
def mb_item(request: pytest.FixtureRequest) -> Any:
    """The planned item (model, variant, seed) of this test; parametrized by modelbench."""
    param = getattr(request, "param", None)
    if param is None:
        pytest.fail(
            "mb_item is parametrized by pytest-modelbench; pass --model NAME", pytrace=False
        )
    return param


@pytest.fixture
def mb_eval(request: pytest.FixtureRequest, mb_item: Any) -> Iterator[EvalResult]:
    """The finished evaluation of this item (computed now, or read from the run store)."""
    # lazily: only tests of benchmark items get here (pytest start-up)
    from pytest_modelbench.secrets import redact

    session = start_session(request.config)
    failure: str | None = None
    try:
        result = session.evaluate(mb_item, request.node)
    except (EvaluationError, ModelbenchUsageError) as exc:
        failure = redact(str(exc))  # a server may echo the API key back in its error
        session.record_error(request.node, mb_item, failure)
    if failure is not None:  # outside the except: the report shows the message only once
        pytest.fail(failure, pytrace=False)
    yield result


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto``: one worker per free GPU group when this session serves models itself."""
    session = config.pluginmanager.get_plugin(SESSION_PLUGIN)
    if session is None or not session.active:
        return None
    try:
        items = session.plan.items
    except ModelbenchUsageError:
        return None
    served = [i for i in items if not i.model.api_base_url]
    if not served:
        return None
    # lazily: loaded only when the hook runs (pytest start-up)
    from pytest_modelbench.serving.gpus import auto_num_workers

    per_server = max((i.model.serve.gpus if i.model.serve else 1) for i in served)
    return auto_num_workers(max(1, per_server))
