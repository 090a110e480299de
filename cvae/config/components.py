"""The registered components by kind and name: the one place that knows which model families,
priors and likelihoods exist.

A component is a class that declares its own frozen `Options` (`cvae.config.settings`); the
config's `model`, `prior` and `likelihood` sections each hold a component's name and its
options. Entries are "module:Class" paths, imported only when a component is used (the first
one imports JAX), like big_vision's models picked by name. A new component is one module and
one line here, or `register(kind, name, path)` at run time; an environment variable per kind
(`CVAE_MODEL_FAMILIES="name=package.module:Class,..."`) registers components in every process
that reads it (the service's workers, `cvae` subprocesses).
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from typing import Any, ClassVar

from cvae.config.settings import as_dict, read
from cvae.errors import ConfigError

KINDS = ("model", "prior", "likelihood")

REGISTRY: dict[str, dict[str, str]] = {
    "model": {"cvae": "cvae.model.one_latent:OneLatent",
              "ladder": "cvae.model.ladder:Ladder",
              "hierarchical": "cvae.model.hierarchical:Hierarchical"},
    "prior": {"standard": "cvae.model.priors:Standard",
              "mixture": "cvae.model.priors:FittedMixture",
              "vamp": "cvae.model.priors:VampPrior",
              "learned_mixture": "cvae.model.priors:LearnedMixture"},
    "likelihood": {"bernoulli": "cvae.model.likelihoods:Bernoulli",
                   "gaussian": "cvae.model.likelihoods:Gaussian",
                   "logistic": "cvae.model.likelihoods:Logistic",
                   "logistic_mixture": "cvae.model.likelihoods:LogisticMixture"},
}
LIKELIHOOD_NAME = "likelihood.name"  # the path of the likelihood's name in a config
ENVIRONMENT = {"model": "CVAE_MODEL_FAMILIES", "prior": "CVAE_PRIORS",
               "likelihood": "CVAE_LIKELIHOODS"}


def register(kind: str, name: str, path: str) -> None:
    """Make component `name` of `kind` ("module:Class"; a bare module means its `Model`)
    available by name."""
    REGISTRY[kind][name] = path if ":" in path else f"{path}:Model"


def _register_from_environment(kind: str) -> None:
    for entry in os.environ.get(ENVIRONMENT[kind], "").split(","):
        name, _, path = (part.strip() for part in entry.partition("="))
        if name:  # a blank entry (a trailing comma and space) names no component
            register(kind, name, path)


def names(kind: str) -> tuple[str, ...]:
    """The names of `kind`'s components, built in first."""
    _register_from_environment(kind)
    return tuple(REGISTRY[kind])


def component(kind: str, name: str) -> type:
    """The class of component `name` of `kind`; ValueError naming the known ones otherwise."""
    if name not in names(kind):
        raise ValueError(f"unknown {kind} {name!r}; known: {', '.join(REGISTRY[kind])}")
    module, _, attribute = REGISTRY[kind][name].partition(":")
    return getattr(importlib.import_module(module), attribute)


def options_class(kind: str, name: str) -> type:
    """The frozen dataclass of component `name`'s options."""
    return component(kind, name).Options


def option_owners(kind: str, option: str) -> list[str]:
    """The components of `kind` that have an option named `option`."""
    return [name for name in names(kind)
            if option in {f.name for f in dataclasses.fields(options_class(kind, name))}]


def with_options(config, kind: str, values: dict[str, Any], *, decided: str):
    """`config` (a `cvae.config.sections.Config`) with these options of its `kind` component
    set (by path), validated; where the component lacks one, the ConfigError also says how
    the component was `decided` (chosen from the data, or its preset's)."""
    section = getattr(config, kind)
    for path in values:
        try:
            section.check_option(path.rsplit(".", 1)[1])
        except ConfigError as error:
            raise ConfigError(f"{error}; the run's {kind} is {decided}") from None
    return config.updated(values).validate()


@dataclasses.dataclass(frozen=True)
class Component:
    """A section that names a registered component and holds its options (None: the
    component's defaults)."""

    KIND: ClassVar[str] = ""
    name: str = ""
    options: Any = None

    def __post_init__(self):
        if self.name not in names(self.KIND):
            raise ConfigError(f"{self.KIND}={self.name!r}: allowed "
                              f"{', '.join(names(self.KIND))}")
        declared = options_class(self.KIND, self.name)
        if self.options is None:
            object.__setattr__(self, "options", declared())
        elif not isinstance(self.options, declared):
            raise ConfigError(f"{self.KIND}.options: not {self.name}'s options")

    @property
    def component(self) -> type:
        """The registered class this section names."""
        return component(self.KIND, self.name)

    def check_option(self, option: str) -> None:
        """ConfigError unless this section's component has `option`, naming those that do."""
        if option in {f.name for f in dataclasses.fields(self.options)}:
            return
        owners = option_owners(self.KIND, option)
        if not owners:
            raise ConfigError(f"{self.KIND}.options.{option}: unknown setting")
        raise ConfigError(f"{option}: an option of the {self.KIND} {' or '.join(owners)}, not "
                          f"of this run's {self.name} (--{self.KIND})")

    def switched_to(self, name: str) -> Component:
        """This section naming `name` instead: the options both components have keep their
        values, the others take `name`'s defaults."""
        if name == self.name:
            return self
        if name not in names(self.KIND):
            raise ConfigError(f"{self.KIND}={name!r}: allowed {', '.join(names(self.KIND))}")
        kept = as_dict(self.options)
        target = options_class(self.KIND, name)
        same = {f.name: getattr(self.options, f.name) for f in dataclasses.fields(target)
                if f.name in kept}
        return type(self)(name, target(**same))


@dataclasses.dataclass(frozen=True)
class ModelSection(Component):
    """model: the family (cvae.model) and its own options."""

    KIND: ClassVar[str] = "model"
    name: str = "cvae"


@dataclasses.dataclass(frozen=True)
class PriorSection(Component):
    """prior: p(z|y) over the codes (cvae.model.priors) and its own options."""

    KIND: ClassVar[str] = "prior"
    name: str = "mixture"


@dataclasses.dataclass(frozen=True)
class LikelihoodSection(Component):
    """likelihood: p(x|z,y) over the pixels (cvae.model.likelihoods) and its own options."""

    KIND: ClassVar[str] = "likelihood"
    name: str = "bernoulli"


def read_component(cls: type, given: dict[str, Any], where: str) -> Component:
    """A component section from its table: `name` and `options`, nothing else."""
    unknown = sorted(set(given) - {"name", "options"})
    if unknown:
        raise ConfigError(f"{where}.{unknown[0]}: unknown setting (a {where} table holds "
                          f"name and options)")
    name = str(given.get("name", cls.name))
    section = cls(name)
    options = given.get("options", {})
    if not isinstance(options, dict):
        raise ConfigError(f"{where}.options: must be a table of settings")
    return cls(name, read(type(section.options), options, f"{where}.options"))
