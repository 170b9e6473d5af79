"""placeholder"""


def plan_levers(*a):
    raise NotImplementedError
